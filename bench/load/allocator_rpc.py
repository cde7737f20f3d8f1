"""The allocator as the benchmark meets it: a server subprocess, a thin Step client, and the
same core and requests in-process for comparison."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import grpc

from allocator_service.core.allocator import Allocator
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.client import open_channel
from pagedserve.protocol.block_codec import op_to_proto
from pagedserve.protocol.block_ops import BlockOp
from pagedserve.supervisor.service_process import AllocatorProcess


@contextmanager
def allocator_server(*extra_args: str) -> Iterator[str]:
    """Starts `python -m allocator_service` on a free loopback port with `extra_args` and waits
    until it reports SERVING; yields host:port. Stopped (SIGTERM, then SIGKILL) on exit."""
    with AllocatorProcess(*extra_args) as process:
        yield process.target


class StepClient:
    """One registered executor's view of the Allocator service: a pool, an epoch, step ids."""

    def __init__(self, channel: grpc.Channel, executor_id: str, num_blocks: int,
                 block_size: int) -> None:
        self.stub = pb_grpc.AllocatorStub(channel)
        self.executor_id = executor_id
        registered = self.stub.RegisterExecutor(pb.RegisterExecutorRequest(
            executor_id=executor_id, address="127.0.0.1:0", num_blocks=num_blocks,
            block_size=block_size, model_fingerprint="bench"))
        self.epoch = registered.epoch
        self.last_step_id = 0
        # Ops whose result was not OK, over every step sent.
        self.num_not_ok = 0

    def reconnect(self, channel: grpc.Channel) -> None:
        """Talks to the allocator over another channel (a restarted server), same pool."""
        self.stub = pb_grpc.AllocatorStub(channel)

    def request(self, ops: Sequence[BlockOp]) -> pb.StepRequest:
        self.last_step_id += 1
        return step_request(self.executor_id, self.epoch, self.last_step_id, ops)

    def send(self, request: pb.StepRequest) -> pb.StepResponse:
        return self.check(self.stub.Step(request))

    def check(self, response: pb.StepResponse) -> pb.StepResponse:
        self.num_not_ok += sum(1 for result in response.results if result.status)
        return response

    def step(self, ops: Sequence[BlockOp]) -> pb.StepResponse:
        return self.send(self.request(ops))


def step_request(executor_id: str, epoch: int, step_id: int,
                 ops: Sequence[BlockOp]) -> pb.StepRequest:
    return pb.StepRequest(executor_id=executor_id, epoch=epoch, step_id=step_id,
                          ops=[op_to_proto(op) for op in ops])


def local_allocator(num_blocks: int, block_size: int) -> tuple[Allocator, int]:
    """An in-process core with one executor "bench" registered; returns it and the epoch."""
    core = Allocator()
    executor = core.register_executor("bench", "", num_blocks, block_size, "bench")
    return core, executor.epoch


def connect(address: str) -> grpc.Channel:
    channel = open_channel(address)
    grpc.channel_ready_future(channel).result(timeout=15)
    return channel
