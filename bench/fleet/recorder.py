"""The simulated executor's allocator client: the real gRPC client (RemoteBlockAllocator),
recording each Step into a StepStream and timing what the executor waited for.

A Step is "overlapped" when the engine ran its forward pass while the Step was in flight (a
steady decode); the engine reads its answer when it needs it (once that pass's tokens are
sampled, or, for decoding sequences' Appends, just before the next Step goes out or a pass
writes a slot it grants: engine.py), and the answer is late (a stall) when it had not come by
then. A Step the pass needed first (an admission, a fork, a copy-on-write, a sequence out of
slots) is "blocking": the executor waits for all of it.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

from bench.fleet.step_stream import RecordedStep, StepStream
from bench.fleet.timed_pass import TimedForwardPass
from executor_service.allocator_client import RemoteBlockAllocator, RemoteStep
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_ops import BlockOp, StepResult

# An answer this much after the engine asked for it still counts as on time: thread hand-offs
# in a busy simulator process take about this long without the allocator being late.
LATE_AFTER_S = 0.001


class RecordingAllocator:
    def __init__(self, client: RemoteBlockAllocator, forward: TimedForwardPass,
                 stream: StepStream) -> None:
        self.client, self.forward, self.stream = client, forward, stream
        self.started_at = 0.0
        self.stalls = 0
        self.blocking_wait_s = 0.0
        self.late_wait_s = 0.0

    def register(self, num_blocks: int, block_size: int, model_fingerprint: str) -> int:
        epoch = self.client.register(num_blocks, block_size, model_fingerprint)
        self.started_at = time.monotonic()
        return epoch

    def submit(self, ops: Sequence[BlockOp]) -> RecordingStep:
        return RecordingStep(self, self.client.submit(ops), len(ops))

    def heartbeat(self, num_waiting: int, num_running: int) -> None:
        self.client.heartbeat(num_waiting, num_running)

    def close(self) -> None:
        self.client.close()


class AnswerClock:
    """When a Step's answer arrived (time.monotonic(); 0 until it has)."""

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self, _future: object) -> None:
        self.at = time.monotonic()


class RecordingStep:
    def __init__(self, recorder: RecordingAllocator, step: RemoteStep, num_ops: int) -> None:
        self.recorder, self.step, self.num_ops = recorder, step, num_ops
        self.passes_at_submit = recorder.forward.passes
        self.submitted_at = time.monotonic()
        # Not a bound method: the future would hold this object, which holds the future (a
        # cycle left for the collector, whose pauses the executor would then be timed with).
        self.answer = AnswerClock()
        step.future.add_done_callback(self.answer)

    def result(self) -> StepResult:
        recorder, forward = self.recorder, self.recorder.forward
        waiting_from = time.monotonic()
        result = self.step.result()
        waited = time.monotonic() - waiting_from
        overlapped = forward.passes > self.passes_at_submit
        if overlapped:
            slack = waiting_from - self.submitted_at
            if self.answer.at > waiting_from + LATE_AFTER_S:
                recorder.stalls += 1
                recorder.late_wait_s += waited
        else:
            slack = 0.0
            recorder.blocking_wait_s += waited
        reply: pb.StepResponse = self.step.future.result()
        ops = pb.StepRequest(ops=self.step.request.ops).SerializeToString()
        recorder.stream.steps.append(RecordedStep(
            self.submitted_at - recorder.started_at, slack,
            (self.answer.at or time.monotonic()) - self.submitted_at, self.num_ops, ops,
            reply.SerializeToString()))
        return result
