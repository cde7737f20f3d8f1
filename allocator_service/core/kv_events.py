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


# An event as the core makes it and the stores take it: a tuple of plain values (a reason is
# its str value, not a PoolResetReason), the tokens packed (block_hash.py). A block enters and
# leaves a prefix cache on the allocator's hottest path, and such a tuple costs a fraction of an
# event object; plain values also let the in-memory store keep a commit's events as one
# marshalled bytes object.
#   (seq, type, executor_id, block_id, block_hash, parent_hash, tokens, reason, num_blocks,
#    block_size)
PackedEvent = tuple[int, int, str, int, bytes, bytes, bytes, str, int, int]

_STORED = int(KvEventType.BLOCK_STORED)
_REMOVED = int(KvEventType.BLOCK_REMOVED)
_RESET = int(KvEventType.POOL_RESET)


def pack(event: KvEvent) -> PackedEvent:
    return (event.seq, int(event.type), event.executor_id, event.block_id, event.block_hash,
            event.parent_hash, pack_tokens(event.token_ids), str(event.reason),
            event.num_blocks, event.block_size)


def unpack(packed: PackedEvent) -> KvEvent:
    seq, type_, executor_id, block_id, block_hash, parent_hash, tokens, reason, num_blocks, \
        block_size = packed
    return KvEvent(seq, KvEventType(type_), executor_id, block_id, block_hash, parent_hash,
                   unpack_tokens(PackedTokens(tokens)), reason, num_blocks, block_size)


class KvEventLog:
    """Numbers events and holds those of the change in progress until the store takes them."""

    def __init__(self, last_seq: int = 0) -> None:
        self.last_seq = last_seq
        self.pending: list[PackedEvent] = []

    def pool_reset(self, executor_id: str, reason: str, num_blocks: int = 0,
                   block_size: int = 0) -> None:
        self.pending.append((self.next_seq(), _RESET, executor_id, 0, b"", b"", b"", str(reason),
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

    __slots__ = ("log", "executor_id")

    def __init__(self, log: KvEventLog, executor_id: str) -> None:
        self.log = log
        self.executor_id = executor_id

    def stored(self, block: Block) -> None:
        assert block.block_hash is not None and block.tokens is not None
        self.log.pending.append((self.log.next_seq(), _STORED, self.executor_id, block.block_id,
                                 block.block_hash, block.parent_hash or b"", block.tokens, "",
                                 0, 0))

    def removed(self, block: Block) -> None:
        assert block.block_hash is not None
        self.log.pending.append((self.log.next_seq(), _REMOVED, self.executor_id, block.block_id,
                                 block.block_hash, b"", b"", "", 0, 0))
