"""The allocator's Step channel as tests speak it: a raw connection that sends any bytes and
reads each reply frame, to see what the allocator answers to bad input and whether it then
closed the connection. Well-behaved Steps go through the executor's own client
(executor_service/step_channel_client.py)."""
from __future__ import annotations

import socket

import pytest

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.step_frames import (LENGTH, StepChannelError, frame, hello_frame,
                                             payload_length, reply_body)


class RawConnection:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.socket = socket.create_connection((host, port), timeout=5)

    def send(self, data: bytes) -> None:
        self.socket.sendall(data)

    def hello(self, executor_id: str, token: str = "") -> None:
        self.send(hello_frame(executor_id, token))
        assert self.reply() == b""

    def step(self, request: pb.StepRequest) -> pb.StepResponse:
        self.send(frame(request.SerializeToString()))
        return pb.StepResponse.FromString(self.reply())

    def reply(self) -> bytes:
        """The next reply's body; an error reply raises StepChannelError."""
        length = payload_length(self._read(LENGTH.size))
        return reply_body(self._read(length))

    def refusal(self) -> StepChannelError:
        with pytest.raises(StepChannelError) as caught:
            self.reply()
        return caught.value

    def closed_by_allocator(self) -> bool:
        """Whether the allocator closed its end (nothing more to read, ever)."""
        try:
            return self.socket.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.socket.close()

    def _read(self, size: int) -> bytes:
        data = self.socket.recv(size, socket.MSG_WAITALL)
        assert len(data) == size, f"the connection ended after {len(data)} of {size} bytes"
        return data
