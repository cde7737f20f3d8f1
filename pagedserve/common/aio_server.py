"""GrpcService's counterpart on grpc.aio, for a service whose calls are coroutines (the
gateway): the same interceptors, health, reflection, TLS and graceful stop, on the running
event loop. Signals are the caller's: the gateway's loop also runs its HTTP server, and one
shutdown drains both.

    service = AsyncGrpcService(options, names, add_servicers)   # inside the running loop
    await service.start()
    await service.set_serving(True)
    ...
    await service.stop()     # NOT_SERVING, then calls in flight get the grace period
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from pagedserve.common.auth import AsyncBearerTokenInterceptor
from pagedserve.common.error_interceptor import AsyncErrorInterceptor
from pagedserve.common.reflection import enable_reflection
from pagedserve.common.server import SERVER_CHANNEL_OPTIONS, ServerOptions, bind, health_status

log = logging.getLogger(__name__)


class AsyncGrpcService:
    def __init__(self, options: ServerOptions, service_names: Sequence[str],
                 add_servicers: Callable[[grpc.aio.Server], None],
                 auth: AsyncBearerTokenInterceptor | None = None) -> None:
        """Binds the port at once (a port in use fails here, with a clear message). `auth`
        checks callers; by default the services' shared token when one is set."""
        self.options = options
        self.service_names = list(service_names)
        interceptors: list[grpc.aio.ServerInterceptor] = [AsyncErrorInterceptor()]
        if auth is None and options.auth_token:
            auth = AsyncBearerTokenInterceptor([options.auth_token])
        if auth is not None:
            interceptors.append(auth)
        self.server = grpc.aio.server(interceptors=interceptors, options=SERVER_CHANNEL_OPTIONS)
        add_servicers(self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection([*self.service_names, health.SERVICE_NAME], self.server)
        self.port = bind(self.server, options)
        self._stopped = False

    async def start(self) -> None:
        """Starts serving, health NOT_SERVING until set_serving(True)."""
        await self.set_serving(False)
        await self.server.start()

    async def set_serving(self, serving: bool) -> None:
        status = health_status(serving)
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self) -> None:
        """Graceful: stop advertising, let calls in flight finish within the grace period."""
        if self._stopped:
            return
        self._stopped = True
        await self.set_serving(False)
        await self.server.stop(self.options.grace_s)
