"""Client channels to pagedserve services, with the bearer token and TLS when configured."""
from __future__ import annotations

import ssl
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.common.auth import BearerTokenClientInterceptor, async_bearer_token_interceptors
from pagedserve.common.server import MAX_MESSAGE_BYTES

# gRPC waits longer and longer between attempts to reach a server that went away (1 s growing
# by 1.6 each time, up to 120 s); calls meanwhile fail at once without trying. An executor must
# reach a restarted allocator within its lease (10 s by default, counted from the state's load),
# or its pool is reclaimed and every request recomputed: after a 30 s outage the default reached
# the server 11.5 s after it was back (2026-11-28). Our services are on loopback or a LAN, so one
# attempt a second costs nothing.
MAX_RECONNECT_BACKOFF_MS = 1000
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
                   ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS)]


def open_channel(target: str, token: str = "", tls_ca: str = "") -> grpc.Channel:
    """A channel to `target` (host:port); TLS when a CA file is given, else plaintext."""
    options = CHANNEL_OPTIONS
    if tls_ca:
        credentials = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if token:
        channel = grpc.intercept_channel(channel, BearerTokenClientInterceptor(token))
    return channel


def open_aio_channel(target: str, token: str = "", tls_ca: str = "") -> grpc.aio.Channel:
    """open_channel's counterpart on grpc.aio. Create it on the event loop that will use it:
    an aio channel belongs to the loop it was made on."""
    interceptors = async_bearer_token_interceptors(token) if token else None
    if tls_ca:
        credentials = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        return grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS,
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS, interceptors=interceptors)


def tls_client_context(tls_ca: str) -> ssl.SSLContext:
    """open_channel's TLS for a connection outside gRPC (the allocator's Step channel): trusts
    the CA file, checks the host name."""
    return ssl.create_default_context(cafile=tls_ca)


def is_serving(channel: grpc.Channel, timeout_s: float = 1.0) -> bool:
    """Whether the server reports grpc health SERVING; False while it does not answer yet."""
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
