"""Wraps the behaviour of a gRPC method handler, whatever its streaming kind.

Server interceptors get an `RpcMethodHandler` whose behaviour sits in one of four attributes;
this rebuilds the handler around a wrapped behaviour so one interceptor serves all four kinds.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

Behaviour = Callable[[Any, grpc.ServicerContext], Any]

_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def wrap_handler(handler: grpc.RpcMethodHandler,
                 wrap: Callable[[Behaviour, bool], Behaviour],
                 wrap_deserializer: Callable[[Any], Any] | None = None
                 ) -> grpc.RpcMethodHandler:
    """`wrap(behaviour, streams_response)` returns the new behaviour; `wrap_deserializer`, if
    given, the new request deserializer (of each message, for a method that takes a stream)."""
    deserializer = handler.request_deserializer
    if wrap_deserializer is not None and deserializer is not None:
        deserializer = wrap_deserializer(deserializer)
    for attribute, build in _KINDS:
        behaviour = getattr(handler, attribute)
        if behaviour is not None:
            return build(wrap(behaviour, handler.response_streaming),
                         request_deserializer=deserializer,
                         response_serializer=handler.response_serializer)
    return handler
