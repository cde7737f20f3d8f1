"""The allocator core in this process, behind the engine's BlockAllocator protocol.

The same Steps as the gRPC service, with no network and no journal: what the in-process
engines of tests, benchmarks and offline runs are built with
(`build_engine(directory, options, LocalBlockAllocator())`).
"""
from __future__ import annotations

from collections.abc import Sequence

from allocator_service.core.allocator import Allocator
from allocator_service.core.executor_pool import ExecutorPool
from pagedserve.protocol.block_ops import BlockOp, StepResult


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
        self.core.events.take()
        return DoneStep(result)

    def heartbeat(self, num_waiting: int, num_running: int) -> None:
        self.core.heartbeat(self.executor_id, self.epoch, num_waiting, num_running)

    def close(self) -> None:
        pass
