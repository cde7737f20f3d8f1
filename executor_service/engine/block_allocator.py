"""The engine's side of the allocation protocol: where a Step goes.

The engine never picks a physical block; it sends every block op of an iteration in one Step
and mirrors the tables it gets back. `BlockAllocator` is what it needs from an allocator:
`RemoteBlockAllocator` (executor_service/allocator_client.py) calls the allocator service over
gRPC; the allocator service's `LocalBlockAllocator` calls an allocator core in this process,
for tests, benchmarks and offline runs. The engine is handed one when it is
built and imports neither. `submit` returns a handle, so an engine can compute while a Step it
does not depend on is in flight.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pagedserve.protocol.block_ops import BlockOp, StepResult


class StepHandle(Protocol):
    def result(self) -> StepResult: ...


class BlockAllocator(Protocol):
    def register(self, num_blocks: int, block_size: int, model_fingerprint: str) -> int:
        """Creates (or resets) this executor's pool; returns the epoch."""

    def submit(self, ops: Sequence[BlockOp]) -> StepHandle:
        """Sends the ops as the next Step (the step id is the allocator client's business)."""

    def heartbeat(self, num_waiting: int, num_running: int) -> None: ...

    def close(self) -> None: ...
