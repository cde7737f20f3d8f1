"""The shared server plumbing: error mapping and bearer auth for every call kind, health."""
from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.common import errors
from pagedserve.common.client import open_channel
from pagedserve.common.server import GrpcService, ServerOptions

SERVICE = "pagedserve.test.Probe"
TOKEN = "s3cret"


def _raise(kind: str) -> None:
    if kind == "invalid":
        raise errors.InvalidArgument("field x must be positive")
    if kind == "missing":
        raise errors.NotFound("no such thing")
    if kind == "bug":
        raise RuntimeError("internal detail that must not reach the client")


def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
    _raise(request.decode())
    return b"ok:" + request


def server_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield b"first"
    _raise(request.decode())  # fails mid-stream, after a message went out
    yield b"second"


def bidi_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    for request in requests:
        _raise(request.decode())
        yield b"echo:" + request


def add_probe(server: grpc.Server) -> None:
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi_stream),
    })])


@pytest.fixture(params=["", TOKEN], ids=["no-auth", "auth"], scope="module")
def probe(request: pytest.FixtureRequest) -> Iterator[tuple[GrpcService, str]]:
    service = GrpcService(ServerOptions(port=0, auth_token=request.param), [SERVICE], add_probe)
    service.start(handle_signals=False)
    service.set_serving(True)
    yield service, request.param
    service.stop()


def calls(channel: grpc.Channel) -> dict[str, object]:
    return {
        "unary": lambda payload: channel.unary_unary(f"/{SERVICE}/Unary")(payload, timeout=5),
        "server_stream": lambda payload: list(
            channel.unary_stream(f"/{SERVICE}/ServerStream")(payload, timeout=5)),
        "bidi": lambda payload: list(
            channel.stream_stream(f"/{SERVICE}/Bidi")(iter([payload]), timeout=5)),
    }


@pytest.mark.parametrize("call", ["unary", "server_stream", "bidi"])
@pytest.mark.parametrize("kind, code, message", [
    ("invalid", grpc.StatusCode.INVALID_ARGUMENT, "field x must be positive"),
    ("missing", grpc.StatusCode.NOT_FOUND, "no such thing"),
])
def test_domain_errors_map_to_their_status_code_for_every_call_kind(
        probe: tuple[GrpcService, str], call: str, kind: str, code: grpc.StatusCode,
        message: str) -> None:
    service, token = probe
    with open_channel(f"127.0.0.1:{service.port}", token) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            calls(channel)[call](kind.encode())  # type: ignore[operator]
    assert caught.value.code() == code
    assert caught.value.details() == message


@pytest.mark.parametrize("call", ["unary", "server_stream", "bidi"])
def test_unexpected_error_is_internal_with_a_request_id_and_no_traceback(
        probe: tuple[GrpcService, str], call: str) -> None:
    service, token = probe
    with open_channel(f"127.0.0.1:{service.port}", token) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            calls(channel)[call](b"bug")  # type: ignore[operator]
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    details = caught.value.details()
    assert details.startswith(f"internal error in /{SERVICE}/") and "request id" in details
    assert "internal detail" not in details and "Traceback" not in details


@pytest.mark.parametrize("call", ["unary", "server_stream", "bidi"])
def test_good_calls_pass_through(probe: tuple[GrpcService, str], call: str) -> None:
    service, token = probe
    expected = {"unary": b"ok:fine", "server_stream": [b"first", b"second"],
                "bidi": [b"echo:fine"]}[call]
    with open_channel(f"127.0.0.1:{service.port}", token) as channel:
        assert calls(channel)[call](b"fine") == expected  # type: ignore[operator]


@pytest.mark.parametrize("probe", [TOKEN], ids=["auth"], indirect=True)
@pytest.mark.parametrize("call", ["unary", "server_stream", "bidi"])
@pytest.mark.parametrize("sent", ["", "wrong"], ids=["missing-token", "wrong-token"])
def test_auth_refuses_every_call_kind_without_the_token(
        probe: tuple[GrpcService, str], call: str, sent: str) -> None:
    service, _ = probe
    with open_channel(f"127.0.0.1:{service.port}", sent) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            calls(channel)[call](b"fine")  # type: ignore[operator]
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("missing 'authorization: Bearer <token>'" if not sent else "wrong bearer token") \
        in caught.value.details()


def test_health_is_open_and_follows_set_serving(probe: tuple[GrpcService, str]) -> None:
    service, _ = probe
    with open_channel(f"127.0.0.1:{service.port}") as channel:  # no token: health stays open
        health = health_pb2_grpc.HealthStub(channel)
        for serving, expected in [(False, health_pb2.HealthCheckResponse.NOT_SERVING),
                                  (True, health_pb2.HealthCheckResponse.SERVING)]:
            service.set_serving(serving)
            for name in ("", SERVICE):
                reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert reply.status == expected
