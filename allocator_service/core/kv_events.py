"""KV events: what entered and left each pool's prefix cache, in order, with sequence numbers.

An external router or dashboard that applies the events in order holds an exact copy of every
pool's hash index:

    BlockStored(executor, block_id, block_hash, parent_hash, token_ids)   index[hash] = block
    BlockRemoved(executor, block_id, block_hash)                          del index[hash]
    PoolReset(executor, reason)                                           index = {}

The core only collects them (numbered, in the order its state changed); the state store
publishes them together with the change that caused them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from allocator_service.core.block import Block


class KvEventType(enum.IntEnum):
    """Values are those of the proto enum KvEventType."""
    BLOCK_STORED = 1
    BLOCK_REMOVED = 2
    POOL_RESET = 3


class PoolResetReason(enum.StrEnum):
    # The executor (re-)registered: a new, empty pool replaced any old one.
    REGISTERED = "registered"
    # The executor stopped renewing its lease: the pool is gone.
    LEASE_EXPIRED = "lease_expired"
    # An admin dropped every prefix-cache entry; blocks in use keep their contents.
    PREFIX_CACHE_RESET = "prefix_cache_reset"
    # The state store lost events (Redis restarted without them): the entries that follow
    # this event are the pool's whole index again.
    RESYNC = "resync"


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and an event is
# made for every block that enters or leaves a prefix cache (the allocator's hottest path).
@dataclass(slots=True)
class KvEvent:
    seq: int
    type: KvEventType
    executor_id: str
    block_id: int = 0
    block_hash: bytes = b""
    parent_hash: bytes = b""
    token_ids: tuple[int, ...] = ()
    reason: str = ""
    # PoolReset: the pool's size after the reset (0 when the pool is gone).
    num_blocks: int = 0
    block_size: int = 0


# An event as an exact tuple of plain values, for keeping many of them: the collector stops
# scanning such a tuple after one pass, where it walks every dataclass instance on every full
# collection (a store keeping the last 100,000 events made each Step pay for that).
PackedEvent = tuple[int, int, str, int, bytes, bytes, tuple[int, ...], str, int, int]


def pack(event: KvEvent) -> PackedEvent:
    return (event.seq, int(event.type), event.executor_id, event.block_id, event.block_hash,
            event.parent_hash, event.token_ids, event.reason, event.num_blocks, event.block_size)


def unpack(packed: PackedEvent) -> KvEvent:
    seq, type_, *fields = packed
    return KvEvent(seq, KvEventType(type_), *fields)  # type: ignore[arg-type]


class KvEventLog:
    """Numbers events and holds those of the change in progress until the store takes them."""

    def __init__(self, last_seq: int = 0) -> None:
        self.last_seq = last_seq
        self.pending: list[KvEvent] = []

    def emit(self, type_: KvEventType, executor_id: str, **fields: object) -> None:
        self.pending.append(KvEvent(self.next_seq(), type_, executor_id, **fields))  # type: ignore[arg-type]

    def next_seq(self) -> int:
        """Numbers the event about to be added (positional construction: the hot path)."""
        self.last_seq += 1
        return self.last_seq

    def drain(self) -> list[KvEvent]:
        events, self.pending = self.pending, []
        return events


class PoolEvents:
    """The event log as one pool's block pool sees it: bound to its executor id."""

    __slots__ = ("log", "executor_id")

    def __init__(self, log: KvEventLog, executor_id: str) -> None:
        self.log = log
        self.executor_id = executor_id

    def stored(self, block: Block) -> None:
        assert block.block_hash is not None and block.token_ids is not None
        self.log.pending.append(KvEvent(
            self.log.next_seq(), KvEventType.BLOCK_STORED, self.executor_id, block.block_id,
            block.block_hash, block.parent_hash or b"", block.token_ids))

    def removed(self, block: Block) -> None:
        assert block.block_hash is not None
        self.log.pending.append(KvEvent(self.log.next_seq(), KvEventType.BLOCK_REMOVED,
                                        self.executor_id, block.block_id, block.block_hash))
