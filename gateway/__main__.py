"""`python -m gateway`: discover executors through the allocator, serve the Gateway API on gRPC
and the OpenAI-compatible API on HTTP, both on one asyncio event loop (the main thread's).

Threads beside the loop: the executor directory (it polls the allocator) and the worker threads
that tokenize and ask the allocator for prefix matches. The executor links are on the loop.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from gateway.admission import Admission
from gateway.cluster_metrics import ClusterCollector
from gateway.config import GatewayConfig, parse_config
from gateway.executors.directory import ExecutorDirectory
from gateway.generation import Generator
from gateway.metrics import GatewayMetrics
from gateway.openai_http.api import OpenAIHttpApi
from gateway.openai_http.server import HttpServer
from gateway.servicer import GatewayServicer
from pagedserve.common.aio_server import AsyncGrpcService
from pagedserve.common.allocator_group import AllocatorGroup
from pagedserve.common.auth import AsyncBearerTokenInterceptor
from pagedserve.common.client import open_aio_channel, open_channel
from pagedserve.common.logs import setup_logging
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
SERVICE_NAMES = [pb.DESCRIPTOR.services_by_name["Gateway"].full_name]
API_KEY_HINT = "send one of the gateway's API keys (--api-key)"
# Worker threads for blocking calls made on behalf of requests (tokenizing, MatchPrefix). A
# MatchPrefix to an allocator that is down blocks for its timeout; enough threads that such a
# wait does not queue the requests behind it.
BLOCKING_WORKERS = 64


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    setup_logging("gateway", config.log_level)
    return asyncio.run(serve(config))


async def serve(config: GatewayConfig) -> int:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(BLOCKING_WORKERS, "gateway-blocking"))
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_signal, signum, stop_requested)

    allocators = AllocatorGroup(config.allocator_group, config.service_token, config.tls_ca)
    directory = ExecutorDirectory(
        allocators, lambda address: open_channel(address, config.service_token, config.tls_ca),
        lambda address: open_aio_channel(address, config.service_token, config.tls_ca),
        loop, config.refresh_s)
    admission = Admission(config.max_running, config.max_queued)
    generator = Generator(directory, allocators, admission)
    metrics = GatewayMetrics()
    metrics.watch_admission(admission)
    metrics.watch_models(lambda: directory.models)
    metrics.registry.register(ClusterCollector(allocators, directory))
    servicer = GatewayServicer(generator, metrics, config.api_keys)
    auth = (AsyncBearerTokenInterceptor(config.api_keys, API_KEY_HINT) if config.api_keys
            else None)
    service = AsyncGrpcService(
        config.server, SERVICE_NAMES,
        lambda server: pb_grpc.add_GatewayServicer_to_server(servicer, server), auth=auth)
    http = HttpServer(OpenAIHttpApi(generator, metrics, config.api_keys,
                                    config.allowed_origins).app,
                      config.server.host, config.http_port, config.server.tls_cert,
                      config.server.tls_key, config.server.grace_s)
    # Health is SERVING while at least one executor is ready (told from the directory's thread).
    directory.on_change = lambda models: asyncio.run_coroutine_threadsafe(
        service.set_serving(bool(models)), loop)
    await service.start()
    http.start()
    print(f"gateway listening on {config.server.host}:{service.port}", flush=True)
    print(f"gateway HTTP API on {http.url}", flush=True)
    directory.start()

    await stop_requested.wait()
    # Both servers drain at once: gRPC streams and HTTP responses get the same grace period.
    http.begin_stop()
    await service.stop()
    await http.stop()
    await asyncio.to_thread(directory.stop)
    allocators.close()
    log.info("stopped")
    return 0


def _on_signal(signum: int, stop_requested: asyncio.Event) -> None:
    log.info("received %s, shutting down", signal.Signals(signum).name)
    stop_requested.set()


if __name__ == "__main__":
    sys.exit(main())
