"""The events stream's entries as docs/durability.md describes them, written and read by the
allocator's codec: every event type survives the round trip, the records are what a reader of
the docs expects, and entries written as JSON (before 2026-11-28), and before the tokens were
packed, still read."""
from __future__ import annotations

import json
import struct

from allocator_service.core.kv_events import KvEvent, KvEventType, PoolResetReason, pack
from allocator_service.durability import redis_codec

KEYS = redis_codec.Keys.under("test")
EVENTS = [
    KvEvent(7, KvEventType.POOL_RESET, 'tricky "id"\n', reason=PoolResetReason.REGISTERED,
            num_blocks=64, block_size=4),
    KvEvent(8, KvEventType.BLOCK_STORED, "e-1", block_id=3, block_hash=bytes(range(16)),
            parent_hash=bytes(range(16, 32)), token_ids=(0, 1, 70000, 2**31 - 1)),
    KvEvent(9, KvEventType.BLOCK_REMOVED, "e-1", block_id=3, block_hash=bytes(range(16))),
    KvEvent(10, KvEventType.POOL_RESET, "e-1", reason=PoolResetReason.LEASE_EXPIRED),
]


def entry(events: list[KvEvent]) -> tuple[bytes, dict[bytes, bytes]]:
    """The entry as Redis hands it back: its id and its fields."""
    command = redis_codec.events_xadd(KEYS, pack(events), None)
    assert command[:2] == ("XADD", KEYS.events)
    *_, entry_id, count_name, count, packed_name, body = command
    assert (count_name, packed_name) == (b"count", b"packed")
    return str(entry_id).encode(), {b"count": str(count).encode(), b"packed": body}


def test_every_event_type_reads_back_as_written():
    entry_id, fields = entry(EVENTS)
    assert entry_id == b"7-0"
    assert redis_codec.entry_last_seq(entry_id, fields) == 10
    assert redis_codec.events_from_entry(entry_id, fields) == EVENTS


def test_the_records_are_the_documented_ones():
    _, fields = entry(EVENTS)
    tricky = 'tricky "id"\n'.encode()
    tokens = struct.pack("<4I", 0, 1, 70000, 2**31 - 1)
    assert fields[b"packed"] == b"".join([
        b"\x00", struct.pack("<i", len(tricky)), tricky,
        b"\x03", struct.pack("<i", 10), b"registered", struct.pack("<qq", 64, 4),
        b"\x00", struct.pack("<i", 3), b"e-1",
        b"\x01", struct.pack("<i", 3), b"\x10", bytes(range(16)), b"\x10", bytes(range(16, 32)),
        struct.pack("<i", 16), tokens,
        b"\x02", struct.pack("<i", 3), b"\x10", bytes(range(16)),
        b"\x03", struct.pack("<i", 13), b"lease_expired", struct.pack("<qq", 0, 0)])


def test_an_entry_written_as_json_still_reads():
    written = [
        {"type": "PoolReset", "executor": 'tricky "id"\n', "reason": "registered",
         "num_blocks": 64, "block_size": 4},
        {"type": "BlockStored", "executor": "e-1", "block": 3, "hash": bytes(range(16)).hex(),
         "parent": bytes(range(16, 32)).hex(),
         "packed_tokens": "00000000" "01000000" "70110100" "ffffff7f"},
        {"type": "BlockRemoved", "executor": "e-1", "block": 3, "hash": bytes(range(16)).hex()},
        {"type": "PoolReset", "executor": "e-1", "reason": "lease_expired", "num_blocks": 0,
         "block_size": 0},
    ]
    assert redis_codec.events_from_entry(
        b"7-0", {b"count": b"4", b"events": json.dumps(written).encode()}) == EVENTS


def test_an_entry_written_before_the_tokens_were_packed_still_reads():
    old = [{"type": "BlockStored", "executor": "e-1", "block": 3, "hash": "00" * 16,
            "parent": "11" * 16, "tokens": [5, 6, 7, 8]}]
    (event,) = redis_codec.events_from_entry(
        b"42-0", {b"count": b"1", b"events": json.dumps(old).encode()})
    assert event == KvEvent(42, KvEventType.BLOCK_STORED, "e-1", block_id=3,
                            block_hash=bytes(16), parent_hash=b"\x11" * 16,
                            token_ids=(5, 6, 7, 8))


def test_the_entry_trims_below_the_entry_it_is_given():
    events = pack(EVENTS[1:])
    assert redis_codec.events_xadd(KEYS, events, 5)[2:6] == ("MINID", "~", "5-0", "8-0")
    assert redis_codec.events_xadd(KEYS, events, None)[2:4] == ("8-0", b"count")
