"""`python -m gateway`: discover executors through the allocator, serve the Gateway API."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from gateway.admission import Admission
from gateway.config import parse_config
from gateway.executor_directory import ExecutorDirectory
from gateway.generation import Generator
from gateway.servicer import GatewayServicer
from pagedserve.common.client import open_channel
from pagedserve.common.logs import setup_logging
from pagedserve.common.server import GrpcService
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc

SERVICE_NAMES = [pb.DESCRIPTOR.services_by_name["Gateway"].full_name]


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    setup_logging("gateway", config.log_level)
    allocator = open_channel(config.allocator, config.service_token, config.tls_ca)
    directory = ExecutorDirectory(
        allocator, lambda address: open_channel(address, config.service_token, config.tls_ca),
        config.refresh_s)
    generator = Generator(directory, allocator,
                          Admission(config.max_running, config.max_queued))
    servicer = GatewayServicer(generator)
    service = GrpcService(config.server, SERVICE_NAMES,
                          lambda server: pb_grpc.add_GatewayServicer_to_server(servicer, server))
    # Health is SERVING while at least one executor is ready.
    directory.on_change = lambda models: service.set_serving(bool(models))
    service.start()
    print(f"gateway listening on {config.server.host}:{service.port}", flush=True)
    directory.start()

    def shut_down() -> None:
        directory.stop()
        allocator.close()

    service.run_until_signal(on_shutdown=shut_down)
    return 0


if __name__ == "__main__":
    sys.exit(main())
