"""The Step channel's frames, both directions: the one codec the allocator's server, the
executor's client and the fleet replay driver share (docs/allocator.md#the-step-channel).

    every frame         u32 little-endian length | payload
    client -> server    first a StepChannelHello, then one StepRequest per frame
    server -> client    u8 status | body
                        status 0: a StepResponse (empty, answering the hello)
                        else: a grpc status code number, body its UTF-8 message

A frame is limited to the gRPC servers' largest message, so a Step too big for the RPC is too
big here as well.
"""
from __future__ import annotations

import struct

import grpc

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.server import MAX_MESSAGE_BYTES

LENGTH = struct.Struct("<I")
OK = 0
CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class StepChannelError(grpc.RpcError):
    """A failed Step (or hello) on the channel, shaped like the failed RPC: `code()` and
    `details()`, so a caller's retry logic serves both transports."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FrameTooLarge(ValueError):
    """A length prefix above MAX_MESSAGE_BYTES: the peer is not speaking this protocol, or
    sends more than the RPC would take."""


def frame(payload: bytes) -> bytes:
    return LENGTH.pack(len(payload)) + payload


def hello_frame(executor_id: str, auth_token: str = "") -> bytes:
    return frame(pb.StepChannelHello(executor_id=executor_id,
                                     auth_token=auth_token).SerializeToString())


def reply_frame(body: bytes) -> bytes:
    """A success: a serialized StepResponse, or b"" answering the hello."""
    return LENGTH.pack(len(body) + 1) + b"\x00" + body


def error_frame(code: grpc.StatusCode, message: str) -> bytes:
    return frame(bytes((code.value[0],)) + message.encode())


def payload_length(header: bytes) -> int:
    """The length a 4-byte prefix announces; FrameTooLarge above the limit."""
    (length,) = LENGTH.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise FrameTooLarge(f"a frame of {length} bytes is larger than the limit of "
                            f"{MAX_MESSAGE_BYTES} bytes")
    return length


def reply_body(payload: bytes) -> bytes:
    """The body of a reply frame's payload; a non-zero status raises it as StepChannelError."""
    if not payload:
        raise StepChannelError(grpc.StatusCode.INTERNAL, "an empty reply frame")
    if payload[0] == OK:
        return payload[1:]
    code = CODE_BY_NUMBER.get(payload[0], grpc.StatusCode.UNKNOWN)
    raise StepChannelError(code, payload[1:].decode(errors="replace"))


class FrameReader:
    """Cuts a byte stream into frame payloads, however the bytes arrive."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads completed by `data`, in order; FrameTooLarge at an oversized prefix."""
        buffer = self._buffer
        buffer += data
        payloads, start = [], 0
        while len(buffer) - start >= LENGTH.size:
            length = payload_length(buffer[start:start + LENGTH.size])
            end = start + LENGTH.size + length
            if len(buffer) < end:
                break
            payloads.append(bytes(buffer[start + LENGTH.size:end]))
            start = end
        del buffer[:start]
        return payloads
