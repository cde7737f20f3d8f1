"""Client channels to pagedserve services, with the bearer token and TLS when configured."""
from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.common.auth import BearerTokenClientInterceptor
from pagedserve.common.server import MAX_MESSAGE_BYTES


def open_channel(target: str, token: str = "", tls_ca: str = "") -> grpc.Channel:
    """A channel to `target` (host:port); TLS when a CA file is given, else plaintext."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    if tls_ca:
        credentials = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if token:
        channel = grpc.intercept_channel(channel, BearerTokenClientInterceptor(token))
    return channel


def is_serving(channel: grpc.Channel, timeout_s: float = 1.0) -> bool:
    """Whether the server reports grpc health SERVING; False while it does not answer yet."""
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
