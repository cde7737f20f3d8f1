"""Maps domain exceptions to gRPC status codes, in one place per service, for every call kind.

A caller's mistake becomes its status code with the exception's message; anything else is a bug
and becomes INTERNAL with a request id to find the traceback in the log, never UNKNOWN with a
traceback in the client's face. It also sets the request id that every log line carries.

A request that does not parse as its method's message (bytes that are not the message, a string
field that is not UTF-8) is the caller's mistake too: INVALID_ARGUMENT, where grpc alone would
answer INTERNAL "Exception deserializing request!".

ErrorInterceptor serves the synchronous servers (allocator, executor); AsyncErrorInterceptor
does the same on a grpc.aio server (the gateway), where behaviours are coroutines or async
generators and `context.abort` is awaited.
"""
from __future__ import annotations

import inspect
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc

from pagedserve.common import errors
from pagedserve.common.logs import request_id
from pagedserve.common.method_handlers import Behaviour, wrap_handler

log = logging.getLogger(__name__)

STATUS_OF: dict[type[errors.PagedServeError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_of(error: errors.PagedServeError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


class ErrorInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None:
            return None
        call_id = _call_id(details)

        def wrap(behaviour: Behaviour, streams_response: bool) -> Behaviour:
            def guarded(request: Any, context: grpc.ServicerContext) -> Any:
                token = request_id.set(call_id)
                try:
                    _refuse_undecodable(request, details.method)
                    return behaviour(request, context)
                except Exception as error:  # noqa: BLE001 - this is the one place that maps them
                    _abort(context, error, details.method, call_id)
                finally:
                    request_id.reset(token)

            def guarded_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                token = request_id.set(call_id)
                try:
                    _refuse_undecodable(request, details.method)
                    yield from behaviour(request, context)
                except Exception as error:  # noqa: BLE001
                    _abort(context, error, details.method, call_id)
                finally:
                    request_id.reset(token)

            return guarded_stream if streams_response else guarded

        return wrap_handler(handler, wrap, _lenient)


class AsyncErrorInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        call_id = _call_id(details)
        # grpc.aio runs every call in a task of its own, so the request id set here stays
        # with this call and needs no reset.

        def wrap(behaviour: Behaviour, streams_response: bool) -> Behaviour:
            async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
                request_id.set(call_id)
                try:
                    _refuse_undecodable(request, details.method)
                    return await behaviour(request, context)
                except Exception as error:  # noqa: BLE001 - this is the one place that maps them
                    await _abort_async(context, error, details.method, call_id)

            async def guarded_stream(request: Any, context: grpc.aio.ServicerContext
                                     ) -> AsyncIterator[Any]:
                request_id.set(call_id)
                try:
                    _refuse_undecodable(request, details.method)
                    async for response in behaviour(request, context):
                        yield response
                except Exception as error:  # noqa: BLE001
                    await _abort_async(context, error, details.method, call_id)

            # A streaming behaviour is an async generator, or a coroutine that writes with
            # `context.write`; the wrapper must be of the same kind.
            return guarded_stream if inspect.isasyncgenfunction(behaviour) else guarded

        return wrap_handler(handler, wrap, _lenient)


def _call_id(details: grpc.HandlerCallDetails) -> str:
    return next((value for key, value in details.invocation_metadata or ()
                 if key == "x-request-id"), None) or _new_request_id()


class Undecodable:
    """Stands in for a request whose bytes did not parse, so the call can refuse it properly.

    A call that takes one request is refused here (INVALID_ARGUMENT). A request stream yields
    one in place of each message that did not parse, and the servicer decides: the executor's
    Session refuses it on the stream and reads on. Without this, grpc itself ends the whole
    call with INTERNAL "Exception deserializing request!"."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize_or_mark(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as error:  # noqa: BLE001 - protobuf raises DecodeError and others
            return Undecodable(error)
    return deserialize_or_mark


def _refuse_undecodable(request: Any, method: str) -> None:
    if isinstance(request, Undecodable):
        raise errors.InvalidArgument(
            f"the request to {method} does not parse as its message: {request.error}")


_PROCESS_TAG = uuid.uuid4().hex[:6]
_call_numbers = itertools.count(1)


def _new_request_id() -> str:
    """Unique across processes and cheap: a per-process random tag and a call counter."""
    return f"{_PROCESS_TAG}-{next(_call_numbers)}"


def _abort(context: grpc.ServicerContext, error: Exception, method: str, call_id: str) -> None:
    if isinstance(error, errors.PagedServeError):
        context.abort(status_of(error), str(error))
    # The servicer aborted the call itself: grpc signals that with a bare Exception().
    if type(error) is Exception and not error.args:
        raise error
    log.exception("%s failed with an unexpected error", method)
    context.abort(grpc.StatusCode.INTERNAL,
                  f"internal error in {method} (request id {call_id}); see the server log")


async def _abort_async(context: grpc.aio.ServicerContext, error: Exception, method: str,
                       call_id: str) -> None:
    if isinstance(error, errors.PagedServeError):
        await context.abort(status_of(error), str(error))
    if isinstance(error, grpc.aio.AbortError):   # the servicer aborted the call itself
        raise error
    log.exception("%s failed with an unexpected error", method)
    await context.abort(grpc.StatusCode.INTERNAL,
                        f"internal error in {method} (request id {call_id}); see the server log")
