"""Bearer-token auth: a server interceptor that checks it and a client interceptor that sends it.

The server side raises Unauthenticated, so it must sit inside the ErrorInterceptor.

Health checks and reflection stay open so orchestrators and grpcurl can probe a service that
requires a token.
"""
from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

from pagedserve.common.errors import Unauthenticated
from pagedserve.common.method_handlers import Behaviour, wrap_handler

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class BearerTokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None or details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        sent = dict(details.invocation_metadata or ()).get("authorization")
        if sent is not None and hmac.compare_digest(str(sent).encode(), self._expected):
            return handler
        reason = ("missing 'authorization: Bearer <token>' metadata" if sent is None
                  else "wrong bearer token")
        message = f"{reason}; pass the service's --auth-token (PAGEDSERVE_AUTH_TOKEN)"

        def wrap(_: Behaviour, __: bool) -> Behaviour:
            def refuse(request: Any, context: grpc.ServicerContext) -> Any:
                raise Unauthenticated(message)  # mapped by the ErrorInterceptor around us
            return refuse

        return wrap_handler(handler, wrap)


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, details: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = details.compression


class BearerTokenClientInterceptor(grpc.UnaryUnaryClientInterceptor,
                                   grpc.UnaryStreamClientInterceptor,
                                   grpc.StreamUnaryClientInterceptor,
                                   grpc.StreamStreamClientInterceptor):
    """Adds the token to every call (works on insecure loopback channels too)."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _ClientCallDetails(details, [*(details.metadata or ()), self._header])

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._with_token(details), requests)
