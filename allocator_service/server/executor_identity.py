"""The allocator's auth when executors have their own tokens (`--executor-tokens`).

Accepted tokens: the shared `--auth-token` (the gateway, operators, pagedctl) and every
executor's own. Then, by who is calling:

    the call                               an executor's token          the shared token
    RegisterExecutor / Heartbeat / Step    only for its own id          refused
    MatchPrefix, every admin RPC           refused                      allowed

Refusals are PERMISSION_DENIED: the caller proved who it is, and may not do this. The shared
token may not act as an executor, so a leaked gateway token cannot touch any pool either.
"""
from __future__ import annotations

from typing import Any

import grpc

from allocator_service.server.executor_tokens import ExecutorTokens
from pagedserve.common.auth import SERVICE_TOKEN_HINT, BearerTokenInterceptor
from pagedserve.common.errors import PermissionDenied
from pagedserve.common.method_handlers import Behaviour, wrap_handler

ALLOCATOR_SERVICE = "/pagedserve.allocator.v1.Allocator/"
EXECUTOR_METHODS = frozenset(f"{ALLOCATOR_SERVICE}{name}"
                             for name in ("RegisterExecutor", "Heartbeat", "Step"))
HINT = f"{SERVICE_TOKEN_HINT}, or an executor's token from --executor-tokens"


class ExecutorIdentityInterceptor(BearerTokenInterceptor):
    def __init__(self, shared_token: str, executor_tokens: ExecutorTokens) -> None:
        super().__init__([shared_token, *executor_tokens.tokens], HINT)
        self._executors = executor_tokens

    def _authorized(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails,
                    sent: str) -> grpc.RpcMethodHandler:
        caller = self._executors.owner(sent)
        method = details.method.rsplit("/", 1)[-1]
        if details.method in EXECUTOR_METHODS:
            return wrap_handler(handler, lambda behaviour, _streams:
                                _only_for(caller, method, behaviour))
        if caller is None:
            return handler
        message = _not_an_executor_method(caller, method)
        return wrap_handler(handler, lambda _behaviour, _streams: _refuse(message))

    def check(self, sent: str | None, method: str, request: Any,
              carrier: str = "metadata") -> None:
        super().check(sent, method, request, carrier)
        caller = self._executors.owner(sent)
        name = method.rsplit("/", 1)[-1]
        if method in EXECUTOR_METHODS:
            check_acts_for(caller, request.executor_id, name)
        elif caller is not None:
            raise PermissionDenied(_not_an_executor_method(caller, name))


def check_acts_for(caller: str | None, wanted: str, method: str) -> None:
    """PermissionDenied unless the caller (the executor whose token it sent; None for the
    shared token) is the executor the request names."""
    if caller is None:
        raise PermissionDenied(
            f"{method} for executor {wanted!r} needs that executor's own token from "
            "--executor-tokens; the shared --auth-token cannot act for an executor")
    if wanted != caller:
        raise PermissionDenied(
            f"executor {caller!r} may not call {method} for executor {wanted!r}: each "
            "executor acts only on its own pool, with its own token")


def _not_an_executor_method(caller: str, method: str) -> str:
    return (f"the token of executor {caller!r} may only call RegisterExecutor, "
            f"Heartbeat and Step for that executor, not {method}; use the shared "
            "--auth-token")


def _only_for(caller: str | None, method: str, behaviour: Behaviour) -> Behaviour:
    """`behaviour`, run only when the request's executor is the caller."""
    def checked(request: Any, context: grpc.ServicerContext) -> Any:
        check_acts_for(caller, request.executor_id, method)
        return behaviour(request, context)
    return checked


def _refuse(message: str) -> Behaviour:
    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        raise PermissionDenied(message)  # mapped by the ErrorInterceptor around us
    return refuse
