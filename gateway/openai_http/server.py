"""Runs the HTTP API (an ASGI app) with uvicorn on the gateway's event loop, beside the gRPC
server (grpc.aio): both share one Generator, so admission limits and routing see every
request, and one loop serves every stream.

The socket is bound here, before uvicorn starts, so a port in use fails the gateway at start
with a clear message, and `--http-port 0` reports the port it got.
"""
from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

log = logging.getLogger(__name__)


class HttpServer:
    def __init__(self, app, host: str, port: int, tls_cert: str = "", tls_key: str = "",
                 grace_s: float = 5.0) -> None:
        self._socket = _bind(host, port)
        self.host, self.port = host, self._socket.getsockname()[1]
        self.scheme = "https" if tls_cert else "http"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                ssl_certfile=tls_cert or None, ssl_keyfile=tls_key or None,
                                timeout_graceful_shutdown=grace_s)
        self._server = _EmbeddedUvicorn(config)
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self) -> None:
        """Serves on the running loop, as a task of it."""
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="http")

    def begin_stop(self) -> None:
        """Stops accepting; responses in flight get the grace period to finish."""
        self._server.should_exit = True

    async def stop(self) -> None:
        self.begin_stop()
        if self._task is not None:
            await self._task

    async def _serve(self) -> None:
        try:
            await self._server.serve(sockets=[self._socket])
        except Exception:  # noqa: BLE001 - logged; the gRPC side keeps serving
            log.exception("the HTTP server stopped")


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway owns SIGTERM and SIGINT and stops
    both servers together."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise SystemExit(f"cannot listen for HTTP on {host}:{port}: {error.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
