"""The executor's end of the allocator's Step channel (docs/allocator.md#the-step-channel): one
blocking TCP (or TLS) connection, used from the allocator client's one call thread, that says
hello once and then carries one Step at a time.

Every failure raises StepChannelError, a grpc.RpcError with the code the Step RPC would have
failed with: the allocator's own status for a refused hello or Step, UNAVAILABLE for a refused,
broken or closed connection, DEADLINE_EXCEEDED for a timeout. So the caller's retry logic serves
both transports. A connection that failed is dropped; the next Step connects again.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.client import tls_client_context
from pagedserve.protocol.step_frames import (LENGTH, FrameTooLarge, StepChannelError, frame,
                                             hello_frame, payload_length, reply_body)

# Refusals after which the allocator may have closed the connection (a frame it could not
# read): connect afresh rather than find out on the next Step. Other refusals keep it.
ENDS_CONNECTION = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                   grpc.StatusCode.PERMISSION_DENIED)


def target_host(target: str) -> str:
    """The host of a HOST:PORT target ([v6]:PORT too): the channel listens on the same host."""
    return target.rsplit(":", 1)[0].strip("[]")


class StepChannelClient:
    def __init__(self, host: str, port: int, executor_id: str, token: str = "",
                 tls_ca: str = "") -> None:
        """`token`: the allocator token a Step RPC would carry; `tls_ca`: verify the
        allocator's TLS with this CA (and `host` as its name), as its gRPC channel does."""
        self.host, self.port, self.executor_id, self.token = host, port, executor_id, token
        self._tls = tls_client_context(tls_ca) if tls_ca else None
        self._socket: socket.socket | None = None

    def step(self, request: pb.StepRequest, timeout_s: float) -> pb.StepResponse:
        deadline = time.monotonic() + timeout_s
        try:
            if self._socket is None:
                self._connect(deadline)
            self._send(frame(request.SerializeToString()), deadline)
            payload = self._read_frame(deadline)
        except BaseException:
            # A refused hello, a broken connection, or a stream cut mid-frame: start afresh.
            self.close()
            raise
        try:
            return pb.StepResponse.FromString(reply_body(payload))
        except StepChannelError as error:
            if error.code() in ENDS_CONNECTION:
                self.close()
            raise

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _connect(self, deadline: float) -> None:
        where = f"the allocator's Step channel at {self.host}:{self.port}"
        with _as_rpc_errors(where):
            sock = socket.create_connection((self.host, self.port), _left(deadline))
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._tls is not None:
                    sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self._socket = sock
        self._send(hello_frame(self.executor_id, self.token), deadline)
        reply_body(self._read_frame(deadline))

    def _send(self, data: bytes, deadline: float) -> None:
        assert self._socket is not None
        with _as_rpc_errors(f"sending to the Step channel at {self.host}:{self.port}"):
            self._socket.settimeout(_left(deadline))
            self._socket.sendall(data)

    def _read_frame(self, deadline: float) -> bytes:
        with _as_rpc_errors(f"reading from the Step channel at {self.host}:{self.port}"):
            try:
                length = payload_length(self._read(LENGTH.size, deadline))
            except FrameTooLarge as error:
                raise StepChannelError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)) from None
            return self._read(length, deadline)

    def _read(self, size: int, deadline: float) -> bytes:
        assert self._socket is not None
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            self._socket.settimeout(_left(deadline))
            received = self._socket.recv_into(view[got:])
            if received == 0:
                raise ConnectionError("the allocator closed the connection")
            got += received
        return bytes(buffer)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


@contextmanager
def _as_rpc_errors(where: str) -> Iterator[None]:
    """Socket failures as the status codes a failed RPC has."""
    try:
        yield
    except TimeoutError:      # socket.timeout too
        raise StepChannelError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"{where}: no answer in time") from None
    except OSError as error:  # refused, reset, closed, TLS, name resolution
        raise StepChannelError(grpc.StatusCode.UNAVAILABLE, f"{where}: {error}") from None
