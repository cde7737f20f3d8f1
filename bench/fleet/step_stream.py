"""A simulated executor's Step stream: every Step it sent, when, how long it could wait for the
answer, and the answer it got. Replaying many streams at their original pace (replay.py) puts
the load of many executors on one allocator without running their schedulers.

A Step's ops are stored serialized without the request's header (executor id, epoch, step id):
protobuf merges concatenated messages, so the replay prepends a header of its own to the same
bytes. The answer is stored serialized too: a pool of the same size given the same ops in the
same order answers the same bytes, which is how a replay checks it drove the allocator exactly
as the executor did.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

from pagedserve.allocator.v1 import allocator_pb2 as pb


@dataclass(frozen=True, slots=True)
class RecordedStep:
    # When the executor sent it, from its registration.
    offset_s: float
    # How long the answer could take without the executor waiting for it: until the engine
    # read it, once the forward pass it overlapped and the sampling were done; 0 when the pass
    # needed the answer first (an admission, a fork, a copy-on-write, a sequence out of slots).
    slack_s: float
    latency_s: float
    num_ops: int
    ops: bytes
    reply: bytes


@dataclass(slots=True)
class StepStream:
    executor_id: str
    num_blocks: int
    block_size: int
    model_fingerprint: str
    iteration_s: float
    duration_s: float
    # Iterations the executor ran, and sequences it finished.
    num_iterations: int = 0
    num_finished: int = 0
    steps: list[RecordedStep] = field(default_factory=list)

    def save(self, path: Path) -> None:
        path.write_bytes(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))

    @staticmethod
    def load(path: Path) -> StepStream:
        stream = pickle.loads(path.read_bytes())  # our own benchmark files only
        assert isinstance(stream, StepStream), f"{path} holds no step stream"
        return stream

    def register_request(self, executor_id: str) -> pb.RegisterExecutorRequest:
        return pb.RegisterExecutorRequest(
            executor_id=executor_id, address="127.0.0.1:0", num_blocks=self.num_blocks,
            block_size=self.block_size, model_fingerprint=self.model_fingerprint)


def step_body(executor_id: str, epoch: int, step_id: int, ops: bytes) -> bytes:
    """A serialized StepRequest: a fresh header, then the recorded ops."""
    header = pb.StepRequest(executor_id=executor_id, epoch=epoch, step_id=step_id)
    return header.SerializeToString() + ops
