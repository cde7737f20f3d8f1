"""The block operations of a Step and their results, as plain domain objects: what an
executor asks of the allocator and what it gets back (codec: block_codec.py).

Not frozen: a frozen dataclass pays an object.__setattr__ per field, and a decode step builds
hundreds of these. Nothing mutates them after construction.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NewType

from pagedserve.common.errors import InvalidArgument

# A sequence's id in its executor's pool: "<request_id>#<choice index>" from the engine.
SeqId = NewType("SeqId", str)


@dataclass(slots=True)
class AllocateOp:
    seq_id: SeqId
    # Any sequence of ints: the allocator's decoder hands over the list protobuf gives it.
    token_ids: Sequence[int]
    cache_salt: str = ""
    lookahead_slots: int = 0


@dataclass(slots=True)
class AppendOp:
    seq_id: SeqId
    token_ids: Sequence[int] = ()
    lookahead_slots: int = 0
    # 0 leaves the computed mark where it is.
    num_computed_tokens: int = 0


@dataclass(slots=True)
class ForkOp:
    parent_seq_id: SeqId
    child_seq_id: SeqId


@dataclass(slots=True)
class FreeOp:
    seq_id: SeqId


BlockOp = AllocateOp | AppendOp | ForkOp | FreeOp


class InvalidOp(InvalidArgument):
    """A malformed op; the whole step is refused before anything applies."""


class OpStatus(enum.IntEnum):
    """Per-op outcome; the values are those of the proto enum OpStatus."""
    OK = 0
    OUT_OF_BLOCKS = 1
    NOT_FOUND = 2
    ALREADY_EXISTS = 3
    TOO_LARGE = 4


@dataclass(slots=True)
class OpResult:
    status: OpStatus = OpStatus.OK
    message: str = ""
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    new_blocks: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)


# The result of most decode appends: applied, no new block, no copy. Shared, never mutated.
OK = OpResult()


@dataclass(slots=True)
class StepResult:
    results: list[OpResult]
    num_free_blocks: int
    replayed: bool = False
    # The StepResponse bytes of this result when the allocator wrote them already (it keeps
    # every answer so for retries); the Step channel sends them as they are. Not compared.
    encoded: bytes = field(default=b"", compare=False, repr=False)
