"""The engine's side of the allocation protocol: where a Step goes.

The engine never picks a physical block; it sends every block op of an iteration in one Step
and mirrors the tables it gets back. `BlockAllocator` is what it needs from an allocator:
`LocalBlockAllocator` calls the allocator core in-process (the in-process Engine of tests and
benchmarks: same protocol, no gRPC), `RemoteBlockAllocator` (remote_allocator.py) the allocator
service. `submit` returns a handle, so an engine can compute while a Step it does not depend on
is in flight.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from allocator_service.allocator import Allocator
from allocator_service.executor_pool import ExecutorPool
from allocator_service.ops import BlockOp, StepResult


class StepHandle(Protocol):
    def result(self) -> StepResult: ...


class BlockAllocator(Protocol):
    def register(self, num_blocks: int, block_size: int, model_fingerprint: str) -> int:
        """Creates (or resets) this executor's pool; returns the epoch."""

    def submit(self, ops: Sequence[BlockOp]) -> StepHandle:
        """Sends the ops as the next Step (the step id is the allocator client's business)."""

    def heartbeat(self, num_waiting: int, num_running: int) -> None: ...

    def close(self) -> None: ...


class DoneStep:
    """A Step that completed when it was submitted."""

    __slots__ = ("_result",)

    def __init__(self, result: StepResult) -> None:
        self._result = result

    def result(self) -> StepResult:
        return self._result


class LocalBlockAllocator:
    """An allocator core in this process, for one executor id."""

    def __init__(self, core: Allocator | None = None, executor_id: str = "local",
                 address: str = "in-process") -> None:
        self.core = core or Allocator()
        self.executor_id, self.address = executor_id, address
        self.epoch = 0
        self.last_step_id = 0

    def register(self, num_blocks: int, block_size: int, model_fingerprint: str) -> int:
        executor = self.core.register_executor(self.executor_id, self.address, num_blocks,
                                               block_size, model_fingerprint)
        self.epoch, self.last_step_id = executor.epoch, 0
        return self.epoch

    @property
    def pool(self) -> ExecutorPool:
        """This executor's pool in the core, for tests and benchmarks that inspect it."""
        return self.core.executors[self.executor_id].pool

    def submit(self, ops: Sequence[BlockOp]) -> DoneStep:
        self.last_step_id += 1
        result = self.core.step(self.executor_id, self.epoch, self.last_step_id, ops)
        # The service's state store takes the core's KV events after each change; in process
        # nobody publishes them, and kept they would grow by a few per request forever.
        self.core.events.drain()
        return DoneStep(result)

    def heartbeat(self, num_waiting: int, num_running: int) -> None:
        self.core.heartbeat(self.executor_id, self.epoch, num_waiting, num_running)

    def close(self) -> None:
        pass
