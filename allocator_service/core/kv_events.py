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

from librt.strings import BytesWriter, read_i32_le, read_i64_le, write_i32_le, write_i64_le
from mypy_extensions import i32, i64

from allocator_service.core.block_hash import (HASH_BYTES, PackedTokens, pack_tokens,
                                               unpack_tokens)


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


# A commit's events as the core makes them and the stores take them: one bytes object of
# records, numbered from `first_seq` on (a commit's events are consecutive). A block enters and
# leaves a prefix cache on the allocator's hottest path; written with librt's BytesWriter,
# which the compiled core turns into stores into a growing buffer, an event costs about 20 ns,
# where a tuple of its fields cost 50 ns to build and 165 ns more to marshal for the in-memory
# ring, and each tuple was one more object for the cyclic collector to count and look at
# (2026-11-28: 7-12 % of a fleet's in-memory allocator). The ring keeps the bytes as they are.
#
# Records, little-endian, each starting with its type byte:
#   EXECUTOR  id: i32 length + UTF-8      the pool of the records that follow, until the next
#   STORED    block_id i32, hash u8 length + bytes, parent u8 length + bytes,
#             tokens i32 length + packed tokens
#   REMOVED   block_id i32, hash u8 length + bytes
#   RESET     reason i32 length + UTF-8, num_blocks i64, block_size i64
# A batch starts with an EXECUTOR record, so it reads on its own: a durable allocator writes it
# to its Redis events stream as it is (durability/redis_codec.py). Readers get each event as a
# tuple of plain values (`records`), the form `unpack` reads:
#   (seq, BLOCK_STORED, executor, block_id, block_hash, parent_hash, tokens)
#   (seq, BLOCK_REMOVED, executor, block_id, block_hash)
#   (seq, POOL_RESET, executor, reason, num_blocks, block_size)
# with the executor id as its UTF-8 bytes and a reason as its str value.
PackedEvent = tuple[Any, ...]

# A record's type byte: an event's is its KvEventType as a plain int.
PACKED_EXECUTOR: Final = 0
PACKED_STORED: Final = int(KvEventType.BLOCK_STORED)
PACKED_REMOVED: Final = int(KvEventType.BLOCK_REMOVED)
PACKED_RESET: Final = int(KvEventType.POOL_RESET)


class PackedEvents:
    """The events of one commit, packed (see above); `len()` is how many."""

    __slots__ = ("first_seq", "count", "data")

    def __init__(self, first_seq: int, count: int, data: bytes) -> None:
        self.first_seq = first_seq
        self.count = count
        self.data = data

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PackedEvents) and self.first_seq == other.first_seq
                and self.count == other.count and self.data == other.data)

    def __repr__(self) -> str:
        return f"PackedEvents(first_seq={self.first_seq}, count={self.count})"


NO_EVENTS: Final = PackedEvents(0, 0, b"")


class _Writer:
    """Writes records into a buffer, an EXECUTOR record whenever the pool changes."""

    __slots__ = ("buffer", "executor")

    def __init__(self) -> None:
        self.buffer = BytesWriter()
        self.executor = b""   # the pool of the last record; none yet

    def for_executor(self, packed_executor_id: bytes) -> BytesWriter:
        buffer = self.buffer
        if packed_executor_id != self.executor:
            buffer.append(PACKED_EXECUTOR)
            write_i32_le(buffer, len(packed_executor_id))
            buffer.write(packed_executor_id)
            self.executor = packed_executor_id
        return buffer

    def stored(self, executor: bytes, block_id: int, block_hash: bytes, parent_hash: bytes,
               tokens: bytes) -> None:
        buffer = self.for_executor(executor)
        buffer.append(PACKED_STORED)
        write_i32_le(buffer, block_id)
        buffer.append(len(block_hash))
        buffer.write(block_hash)
        buffer.append(len(parent_hash))
        buffer.write(parent_hash)
        write_i32_le(buffer, len(tokens))
        buffer.write(tokens)

    def removed(self, executor: bytes, block_id: int, block_hash: bytes) -> None:
        buffer = self.for_executor(executor)
        buffer.append(PACKED_REMOVED)
        write_i32_le(buffer, block_id)
        buffer.append(len(block_hash))
        buffer.write(block_hash)

    def removed_halves(self, executor: bytes, block_id: i64, lo: i64, hi: i64) -> None:
        """`removed` of a 16-byte hash given as its two halves, as the pools keep it."""
        buffer = self.for_executor(executor)
        buffer.append(PACKED_REMOVED)
        write_i32_le(buffer, i32(block_id))
        buffer.append(HASH_BYTES)
        write_i64_le(buffer, lo)
        write_i64_le(buffer, hi)

    def reset(self, executor: bytes, reason: str, num_blocks: int, block_size: int) -> None:
        buffer = self.for_executor(executor)
        buffer.append(PACKED_RESET)
        encoded = reason.encode()
        write_i32_le(buffer, len(encoded))
        buffer.write(encoded)
        write_i64_le(buffer, num_blocks)
        write_i64_le(buffer, block_size)


def records(events: PackedEvents) -> list[PackedEvent]:
    """The events as tuples of plain values (above), in order."""
    data, seq, at, end = events.data, events.first_seq, 0, len(events.data)
    executor = b""
    found: list[PackedEvent] = []
    while at < end:
        type_ = data[at]
        at += 1
        if type_ == PACKED_EXECUTOR:
            length = read_i32_le(data, at)
            executor = data[at + 4:at + 4 + length]
            at += 4 + length
        elif type_ == PACKED_STORED:
            block_id = read_i32_le(data, at)
            hash_end = at + 5 + data[at + 4]
            parent_end = hash_end + 1 + data[hash_end]
            tokens_length = read_i32_le(data, parent_end)
            found.append((seq, PACKED_STORED, executor, block_id, data[at + 5:hash_end],
                          data[hash_end + 1:parent_end],
                          data[parent_end + 4:parent_end + 4 + tokens_length]))
            at = parent_end + 4 + tokens_length
            seq += 1
        elif type_ == PACKED_REMOVED:
            block_id = read_i32_le(data, at)
            hash_end = at + 5 + data[at + 4]
            found.append((seq, PACKED_REMOVED, executor, block_id, data[at + 5:hash_end]))
            at = hash_end
            seq += 1
        elif type_ == PACKED_RESET:
            length = read_i32_le(data, at)
            reason = data[at + 4:at + 4 + length].decode()
            at += 4 + length
            found.append((seq, PACKED_RESET, executor, reason, read_i64_le(data, at),
                          read_i64_le(data, at + 8)))
            at += 16
            seq += 1
        else:
            raise ValueError(f"packed events: unknown record type {type_} at byte {at - 1}")
    if len(found) != events.count:
        raise ValueError(f"packed events: {len(found)} records where {events.count} were "
                         "counted")
    return found


def pack(events: list[KvEvent]) -> PackedEvents:
    """Events (consecutive numbers) packed as the core packs them; for tests and tools."""
    if not events:
        return NO_EVENTS
    writer = _Writer()
    for expected, event in enumerate(events, start=events[0].seq):
        assert event.seq == expected, "packed events are numbered consecutively"
        executor = event.executor_id.encode()
        if event.type == KvEventType.BLOCK_STORED:
            writer.stored(executor, event.block_id, event.block_hash, event.parent_hash,
                          pack_tokens(event.token_ids))
        elif event.type == KvEventType.BLOCK_REMOVED:
            writer.removed(executor, event.block_id, event.block_hash)
        else:
            writer.reset(executor, str(event.reason), event.num_blocks, event.block_size)
    return PackedEvents(events[0].seq, len(events), writer.buffer.getvalue())


def unpack(events: PackedEvents) -> list[KvEvent]:
    return [unpack_record(record) for record in records(events)]


def unpack_record(packed: PackedEvent) -> KvEvent:
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
    """Numbers events and packs those of the change in progress until the store takes them."""

    def __init__(self, last_seq: int = 0) -> None:
        self.last_seq = last_seq
        self.num_pending = 0
        self.writer = _Writer()

    def pool_reset(self, executor_id: str, reason: str, num_blocks: int = 0,
                   block_size: int = 0) -> None:
        self.writer.reset(executor_id.encode(), str(reason), num_blocks, block_size)
        self.added()

    def added(self) -> None:
        """Numbers the event just written."""
        self.last_seq += 1
        self.num_pending += 1

    def take(self) -> PackedEvents:
        """The pending events, packed, for the store."""
        if not self.num_pending:
            return NO_EVENTS
        events = PackedEvents(self.last_seq - self.num_pending + 1, self.num_pending,
                              self.writer.buffer.getvalue())
        self.num_pending = 0
        self.writer = _Writer()
        return events

    def drain(self) -> list[KvEvent]:
        """The pending events as objects (for readers that look at them one by one)."""
        return unpack(self.take())


class PoolEvents:
    """The event log as one pool's block pool sees it: bound to its executor id."""

    __slots__ = ("log", "executor_id", "packed_executor_id")

    def __init__(self, log: KvEventLog, executor_id: str) -> None:
        self.log = log
        self.executor_id = executor_id
        self.packed_executor_id = executor_id.encode()  # as packed events carry it

    def stored(self, block_id: i64, block_hash: bytes, parent_hash: bytes,
               tokens: bytes) -> None:
        log = self.log
        log.writer.stored(self.packed_executor_id, block_id, block_hash, parent_hash, tokens)
        log.added()

    def removed(self, block_id: i64, hash_lo: i64, hash_hi: i64) -> None:
        """Block `block_id` left the index; its hash given as its halves (hash_index.py)."""
        log = self.log
        log.writer.removed_halves(self.packed_executor_id, block_id, hash_lo, hash_hi)
        log.added()
