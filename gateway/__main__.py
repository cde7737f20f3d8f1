"""`python -m gateway`: discover executors through the allocator, serve the Gateway API on gRPC
and the OpenAI-compatible API on HTTP."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from gateway.admission import Admission
from gateway.cluster_metrics import ClusterCollector
from gateway.config import parse_config
from gateway.executor_directory import ExecutorDirectory
from gateway.generation import Generator
from gateway.http_api import OpenAIHttpApi
from gateway.http_server import HttpServer
from gateway.metrics import GatewayMetrics
from gateway.servicer import GatewayServicer
from pagedserve.common.auth import BearerTokenInterceptor
from pagedserve.common.client import open_channel
from pagedserve.common.logs import setup_logging
from pagedserve.common.server import GrpcService
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc

SERVICE_NAMES = [pb.DESCRIPTOR.services_by_name["Gateway"].full_name]
API_KEY_HINT = "send one of the gateway's API keys (--api-key)"


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    setup_logging("gateway", config.log_level)
    allocator = open_channel(config.allocator, config.service_token, config.tls_ca)
    directory = ExecutorDirectory(
        allocator, lambda address: open_channel(address, config.service_token, config.tls_ca),
        config.refresh_s)
    admission = Admission(config.max_running, config.max_queued)
    generator = Generator(directory, allocator, admission)
    metrics = GatewayMetrics()
    metrics.watch_admission(admission)
    metrics.registry.register(ClusterCollector(allocator, directory))
    servicer = GatewayServicer(generator, metrics)
    auth = BearerTokenInterceptor(config.api_keys, API_KEY_HINT) if config.api_keys else None
    service = GrpcService(config.server, SERVICE_NAMES,
                          lambda server: pb_grpc.add_GatewayServicer_to_server(servicer, server),
                          auth=auth)
    http = HttpServer(OpenAIHttpApi(generator, metrics, config.api_keys).app,
                      config.server.host, config.http_port, config.server.tls_cert,
                      config.server.tls_key, config.server.grace_s)
    # Health is SERVING while at least one executor is ready.
    directory.on_change = lambda models: service.set_serving(bool(models))
    service.start()
    http.start()
    print(f"gateway listening on {config.server.host}:{service.port}", flush=True)
    print(f"gateway HTTP API on {http.url}", flush=True)
    directory.start()

    def shut_down() -> None:
        http.stop()
        directory.stop()
        allocator.close()

    # Both servers drain at once: gRPC streams and HTTP responses get the same grace period.
    service.run_until_signal(on_shutdown=shut_down, on_stop_requested=http.begin_stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
