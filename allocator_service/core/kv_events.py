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
from typing import Any, Final

from allocator_service.core.block import Block
from allocator_service.core.block_hash import PackedTokens, pack_tokens, unpack_tokens


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


# Not frozen: a frozen dataclass sets each field through object.__setattr__.
@dataclass(slots=True)
class KvEvent:
    """An event as readers see it (the admin stream, the Redis stream, tests)."""
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


# An event as the core makes it and the stores take it: a tuple of plain values, as long as
# its type needs, the tokens packed (block_hash.py), the executor id as its UTF-8 bytes and a
# reason as its str value (not a PoolResetReason):
#   (seq, BLOCK_STORED, executor, block_id, block_hash, parent_hash, tokens)
#   (seq, BLOCK_REMOVED, executor, block_id, block_hash)
#   (seq, POOL_RESET, executor, reason, num_blocks, block_size)
# A block enters and leaves a prefix cache on the allocator's hottest path, and such a tuple
# costs a fraction of an event object; plain values also let the in-memory store keep a
# commit's events as one marshalled bytes object. Marshal's version 2 writes bytes as they are
# but encodes a str anew each time, and writes every field: with one layout for all types
# (ten fields, the unused ones "" and 0) and the id as a str, a Step's events took twice as
# long to marshal, about 5 % of a fleet's in-memory allocator.
PackedEvent = tuple[Any, ...]

# A packed event's type field (its KvEventType as a plain int).
PACKED_STORED: Final = int(KvEventType.BLOCK_STORED)
PACKED_REMOVED: Final = int(KvEventType.BLOCK_REMOVED)
PACKED_RESET: Final = int(KvEventType.POOL_RESET)


def pack(event: KvEvent) -> PackedEvent:
    executor = event.executor_id.encode()
    if event.type == KvEventType.BLOCK_STORED:
        return (event.seq, PACKED_STORED, executor, event.block_id, event.block_hash,
                event.parent_hash, pack_tokens(event.token_ids))
    if event.type == KvEventType.BLOCK_REMOVED:
        return (event.seq, PACKED_REMOVED, executor, event.block_id, event.block_hash)
    return (event.seq, PACKED_RESET, executor, str(event.reason), event.num_blocks,
            event.block_size)


def unpack(packed: PackedEvent) -> KvEvent:
    seq, type_, executor = packed[0], KvEventType(packed[1]), packed[2].decode()
    if type_ == KvEventType.BLOCK_STORED:
        _, _, _, block_id, block_hash, parent_hash, tokens = packed
        return KvEvent(seq, type_, executor, block_id, block_hash, parent_hash,
                       unpack_tokens(PackedTokens(tokens)))
    if type_ == KvEventType.BLOCK_REMOVED:
        _, _, _, block_id, block_hash = packed
        return KvEvent(seq, type_, executor, block_id, block_hash)
    _, _, _, reason, num_blocks, block_size = packed
    return KvEvent(seq, type_, executor, reason=reason, num_blocks=num_blocks,
                   block_size=block_size)


class KvEventLog:
    """Numbers events and holds those of the change in progress until the store takes them."""

    def __init__(self, last_seq: int = 0) -> None:
        self.last_seq = last_seq
        self.pending: list[PackedEvent] = []

    def pool_reset(self, executor_id: str, reason: str, num_blocks: int = 0,
                   block_size: int = 0) -> None:
        self.pending.append((self.next_seq(), PACKED_RESET, executor_id.encode(), str(reason),
                             num_blocks, block_size))

    def next_seq(self) -> int:
        """Numbers the event about to be added."""
        self.last_seq += 1
        return self.last_seq

    def take(self) -> list[PackedEvent]:
        """The pending events, packed, for the store."""
        events, self.pending = self.pending, []
        return events

    def drain(self) -> list[KvEvent]:
        """The pending events as objects (for readers that look at them one by one)."""
        return [unpack(event) for event in self.take()]


class PoolEvents:
    """The event log as one pool's block pool sees it: bound to its executor id."""

    __slots__ = ("log", "executor_id", "packed_executor_id")

    def __init__(self, log: KvEventLog, executor_id: str) -> None:
        self.log = log
        self.executor_id = executor_id
        self.packed_executor_id = executor_id.encode()  # as packed events carry it

    def stored(self, block: Block) -> None:
        assert block.block_hash is not None and block.tokens is not None
        self.log.pending.append((self.log.next_seq(), PACKED_STORED, self.packed_executor_id,
                                 block.block_id, block.block_hash, block.parent_hash or b"",
                                 block.tokens))

    def removed(self, block: Block) -> None:
        assert block.block_hash is not None
        self.log.pending.append((self.log.next_seq(), PACKED_REMOVED, self.packed_executor_id,
                                 block.block_id, block.block_hash))
