"""Bearer-token auth: a server interceptor that checks it and a client interceptor that sends it.

The server side raises Unauthenticated, so it must sit inside the ErrorInterceptor.

Health checks and reflection stay open so orchestrators and grpcurl can probe a service that
requires a token.
"""
from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from pagedserve.common.errors import Unauthenticated
from pagedserve.common.method_handlers import Behaviour, wrap_handler

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


SERVICE_TOKEN_HINT = "pass the service's --auth-token (PAGEDSERVE_AUTH_TOKEN)"


def bearer_refusal(sent: str | None, tokens: Sequence[str], carrier: str = "metadata"
                   ) -> str | None:
    """Why an `authorization` value (gRPC metadata, or an HTTP header) is refused; None when it
    carries one of `tokens`.

    Every token is compared in constant time, so timing tells nothing about which one nearly
    matched."""
    if sent is None:
        return f"missing 'authorization: Bearer <token>' {carrier}"
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(str(sent).encode(), f"Bearer {token}".encode())
    return None if matched else "wrong bearer token"


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Accepts calls whose `authorization` metadata carries any of `tokens` (the services'
    shared token, or the gateway's client API keys); `hint` tells a refused caller what to
    send."""

    def __init__(self, tokens: Sequence[str], hint: str = SERVICE_TOKEN_HINT) -> None:
        self._tokens = tuple(tokens)
        self._hint = hint

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._checked(continuation(details), details)

    def _checked(self, handler: grpc.RpcMethodHandler | None,
                 details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The handler itself, or one that refuses the call when its token is not ours."""
        if handler is None or details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        sent = dict(details.invocation_metadata or ()).get("authorization")
        message = self.refusal(sent)
        if message is None:
            return self._authorized(handler, details, sent)
        refuse = self._refusal(message)
        return wrap_handler(handler, lambda _behaviour, _streams: refuse)

    def refusal(self, sent: str | None, carrier: str = "metadata") -> str | None:
        """Why a caller sending the `authorization` value `sent` is refused, with the hint;
        None when it carries one of our tokens."""
        reason = bearer_refusal(sent, self._tokens, carrier)
        return None if reason is None else f"{reason}; {self._hint}"

    def check(self, sent: str | None, method: str, request: Any,
              carrier: str = "metadata") -> None:
        """This interceptor's verdict on a call that reaches the service outside gRPC (the
        allocator's Step channel, whose hello carries the token): raises what the handler
        would, Unauthenticated for a token not ours. A subclass that narrows `_authorized`
        narrows this the same way."""
        message = self.refusal(sent, carrier)
        if message is not None:
            raise Unauthenticated(message)

    def _authorized(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails,
                    sent: str) -> grpc.RpcMethodHandler:
        """The handler for a caller whose token was accepted: a subclass may narrow what that
        token's holder may do (the allocator's per-executor tokens)."""
        return handler

    @staticmethod
    def _refusal(message: str) -> Behaviour:
        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            raise Unauthenticated(message)  # mapped by the ErrorInterceptor around us
        return refuse


class AsyncBearerTokenInterceptor(BearerTokenInterceptor, grpc.aio.ServerInterceptor):
    """The same check on a grpc.aio server, inside its AsyncErrorInterceptor."""

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler | None:
        return self._checked(await continuation(details), details)

    @staticmethod
    def _refusal(message: str) -> Behaviour:
        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            raise Unauthenticated(message)
        return refuse


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


class _AsyncTokenCalls:
    """Adds the token to a grpc.aio call's metadata."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._header)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                          details.credentials, details.wait_for_ready)


class _AsyncTokenUnaryUnary(_AsyncTokenCalls, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(details), request)


class _AsyncTokenUnaryStream(_AsyncTokenCalls, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(details), request)


class _AsyncTokenStreamUnary(_AsyncTokenCalls, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(details), requests)


class _AsyncTokenStreamStream(_AsyncTokenCalls, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._with_token(details), requests)


def async_bearer_token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """BearerTokenClientInterceptor's counterpart on a grpc.aio channel: one interceptor per
    kind of call, because grpc.aio files each interceptor under the first kind it implements."""
    return [kind(token) for kind in (_AsyncTokenUnaryUnary, _AsyncTokenUnaryStream,
                                     _AsyncTokenStreamUnary, _AsyncTokenStreamStream)]
