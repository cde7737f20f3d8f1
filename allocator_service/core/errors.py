"""Typed errors of the allocator core: each one is a caller bug, named after what went wrong.
A malformed op is the block protocol's own InvalidOp (pagedserve.protocol.block_ops)."""
from __future__ import annotations

from pagedserve.common.errors import AlreadyExists, FailedPrecondition, NotFound


class UnknownExecutor(NotFound):
    def __init__(self, executor_id: str) -> None:
        super().__init__(
            f"executor {executor_id!r} is not registered (never registered, or its lease lapsed "
            "and the pool was reclaimed); call RegisterExecutor first"
        )


class ExecutorIndexTaken(AlreadyExists):
    def __init__(self, executor_id: str, index: int, holder: str, lease_remaining_s: float) -> None:
        super().__init__(
            f"executor {executor_id!r} registers as executor index {index}, which executor "
            f"{holder!r} holds (its lease lapses in {lease_remaining_s:.1f} s unless renewed): "
            "give every executor of the fleet its own --executor-index, or none")


class StaleEpoch(FailedPrecondition):
    def __init__(self, executor_id: str, sent: int, current: int) -> None:
        super().__init__(
            f"executor {executor_id!r} sent epoch {sent} but its pool is at epoch {current}: the "
            "pool was reset by a newer registration; register again and resubmit"
        )


class UnknownSequence(NotFound):
    def __init__(self, seq_id: str) -> None:
        super().__init__(f"sequence {seq_id!r} is not allocated in this pool (never allocated, "
                         "or already freed)")


class SequenceExists(AlreadyExists):
    def __init__(self, seq_id: str) -> None:
        super().__init__(f"sequence {seq_id!r} already exists in this pool; free it first or "
                         "pick a new id")


class StepIdReused(FailedPrecondition):
    """A step id was sent again with different ops: replaying it would apply something else."""


class StepIdTooOld(FailedPrecondition):
    """A step id below the last one whose record is no longer kept: it cannot be answered."""
