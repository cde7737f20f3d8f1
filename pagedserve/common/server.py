"""Server bootstrap shared by every service: interceptors, health, reflection, TLS, shutdown.

Lifecycle, in order:
    start()            health NOT_SERVING while the service warms up
    set_serving(True)  once the core is ready
    SIGTERM / SIGINT   health NOT_SERVING → server.stop(grace) → the service's own shutdown

The gateway, whose calls are coroutines, uses the grpc.aio counterpart in aio_server.py; the
binding, TLS and health helpers here serve both.
"""
from __future__ import annotations

import logging
import signal
import ssl
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.common.auth import BearerTokenInterceptor
from pagedserve.common.error_interceptor import ErrorInterceptor
from pagedserve.common.reflection import enable_reflection

log = logging.getLogger(__name__)

# Messages up to 64 MiB: a Step of many long prompts is large, but never unbounded.
MAX_MESSAGE_BYTES = 64 << 20


@dataclass(slots=True, frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 0
    auth_token: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    max_workers: int = 16
    grace_s: float = 5.0


SERVER_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                          ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                          ("grpc.so_reuseport", 0)]


def bind(server: grpc.Server | grpc.aio.Server, options: ServerOptions) -> int:
    """Listens on the options' address (TLS when a certificate is given); the port it got."""
    address = f"{options.host}:{options.port}"
    try:
        if options.tls_cert or options.tls_key:
            port = server.add_secure_port(address, tls_credentials(options))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # newer grpcio raises where older ones return 0
        port = 0
    if port == 0:
        raise SystemExit(f"cannot listen on {address} (port in use, or no such interface)")
    return port


def tls_credentials(options: ServerOptions) -> grpc.ServerCredentials:
    if not (options.tls_cert and options.tls_key):
        raise SystemExit("TLS needs both --tls-cert and --tls-key")
    return grpc.ssl_server_credentials([(
        Path(options.tls_key).read_bytes(), Path(options.tls_cert).read_bytes())])


def tls_context(options: ServerOptions) -> ssl.SSLContext:
    """tls_credentials' counterpart for a listener outside gRPC (the allocator's Step channel):
    the same certificate and key."""
    if not (options.tls_cert and options.tls_key):
        raise SystemExit("TLS needs both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(options.tls_cert, options.tls_key)
    return context


def health_status(serving: bool) -> int:
    return (health_pb2.HealthCheckResponse.SERVING if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING)


class GrpcService:
    def __init__(self, options: ServerOptions, service_names: Sequence[str],
                 add_servicers: Callable[[grpc.Server], None],
                 auth: BearerTokenInterceptor | None = None) -> None:
        """`auth` checks callers; by default the services' shared token when one is set."""
        self.options = options
        self.service_names = list(service_names)
        interceptors: list[grpc.ServerInterceptor] = [ErrorInterceptor()]
        if auth is None and options.auth_token:
            auth = BearerTokenInterceptor([options.auth_token])
        if auth is not None:
            interceptors.append(auth)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=options.max_workers),
            interceptors=interceptors, options=SERVER_CHANNEL_OPTIONS)
        add_servicers(self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection([*self.service_names, health.SERVICE_NAME], self.server)
        self.port = bind(self.server, options)
        self.set_serving(False)
        self._stopped = threading.Event()

    def set_serving(self, serving: bool) -> None:
        status = health_status(serving)
        for name in ("", *self.service_names):
            self.health.set(name, status)

    def start(self, handle_signals: bool = True) -> None:
        """Starts serving. With handle_signals (the main thread of a service process), SIGTERM
        and SIGINT request a graceful stop from here on, before anyone learns the port."""
        self._stop_requested = threading.Event()

        def request_stop(signum: int, _frame: object) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            self._stop_requested.set()

        if handle_signals:
            signal.signal(signal.SIGTERM, request_stop)
            signal.signal(signal.SIGINT, request_stop)
        self.server.start()

    def request_stop(self) -> None:
        """Asks run_until_signal to shut down, as SIGTERM would (from any thread)."""
        self._stop_requested.set()

    def stop(self) -> None:
        """Graceful: stop advertising, let calls in flight finish within the grace period."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.set_serving(False)
        self.server.stop(self.options.grace_s).wait()

    def run_until_signal(self, on_shutdown: Callable[[], None] = lambda: None,
                         on_stop_requested: Callable[[], None] = lambda: None) -> None:
        """Blocks until SIGTERM or SIGINT (handlers installed by start()), then shuts down in
        order: `on_stop_requested` (e.g. another server starts draining alongside), the gRPC
        server's graceful stop, then `on_shutdown`."""
        while not self._stop_requested.wait(0.5):
            pass
        on_stop_requested()
        self.stop()
        on_shutdown()
        log.info("stopped")
