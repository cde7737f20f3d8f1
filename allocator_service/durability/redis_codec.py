"""How the allocator's state looks in Redis: the keys, and the encoding of what is under them.

    {ns}:journal    stream, entry id "<seq>-0", fields kind, body: every command since the
                    snapshot, in order (see commands.py)
    {ns}:snapshot   string: zlib-compressed JSON of the whole state at seq `snapshot_seq`
    {ns}:meta       hash: snapshot_seq, format
    {ns}:events     stream capped at about --events-max events: one entry per command (a
                    Step's events go in one XADD), entry id "<seq of its first event>-0",
                    fields count and events (below)

The stored state is the snapshot plus every journal entry after it. Journal entry ids are the
sequence numbers themselves; an events entry's id is the number of its first event, so
`XREVRANGE {ns}:events 1200 - COUNT 1` finds the entry that holds event 1200.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

import redis

from allocator_service.core.block_hash import PackedTokens, unpack_tokens
from allocator_service.core.event_json import EVENT_TYPE_TEXT, encode_events
from allocator_service.core.kv_events import KvEvent, KvEventType, PackedEvents
from allocator_service.durability.commands import Command

DEFAULT_NAMESPACE = "pagedserve:allocator"

@dataclass(slots=True, frozen=True)
class Keys:
    journal: str
    snapshot: str
    meta: str
    events: str

    @classmethod
    def under(cls, namespace: str) -> Keys:
        return cls(f"{namespace}:journal", f"{namespace}:snapshot", f"{namespace}:meta",
                   f"{namespace}:events")


def entry_id(seq: int) -> str:
    return f"{seq}-0"


def seq_of(entry_id_: bytes) -> int:
    return int(entry_id_.split(b"-", 1)[0])


# -- journal -----------------------------------------------------------------------------------

def journal_xadd(keys: Keys, seq: int, command: Command) -> tuple[str | bytes, ...]:
    """The XADD (its arguments) that journals command number `seq`."""
    return ("XADD", keys.journal, entry_id(seq), b"kind", command.kind.encode(), b"body",
            command.body)


def command_from_fields(fields: dict[bytes, bytes]) -> Command:
    return Command(fields[b"kind"].decode(), fields[b"body"])


def connected_run_id(connection: Any) -> bytes:
    """Completes a new connection (a redis-py `redis_connect_func`) and returns the server's
    run_id, which changes whenever Redis restarts."""
    connection.on_connect()
    connection.send_command("INFO", "server")
    server_info: bytes = connection.read_response()
    for line in server_info.splitlines():
        if line.startswith(b"run_id:"):
            return line.split(b":", 1)[1].strip()
    # A Redis error, so that a connection refused for it reads as one to every caller.
    raise redis.ResponseError("INFO server has no run_id")


# -- snapshot ----------------------------------------------------------------------------------

def encode_snapshot(data: dict[str, Any]) -> bytes:
    # Level 1: snapshots are mostly token ids and hex; faster levels compress them nearly as well.
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 1)


def decode_snapshot(blob: bytes) -> dict[str, Any]:
    return json.loads(zlib.decompress(blob))


# -- events ------------------------------------------------------------------------------------
#
# An entry holds the events of one command, numbered on from its id: fields `count` and
# `events`, a JSON array of objects in order, each with
#
#   type           BlockStored | BlockRemoved | PoolReset
#   executor       executor id
#   block          block id                       (BlockStored, BlockRemoved)
#   hash           block hash, hex                (BlockStored, BlockRemoved)
#   parent         parent block hash, hex         (BlockStored; the chain root for a first block)
#   packed_tokens  the token ids as little-endian uint32, hex: the bytes the hash covers
#                  (BlockStored; entries written before 2026-11-25 carry `tokens`, an array)
#   reason         registered | lease_expired | prefix_cache_reset | resync   (PoolReset)
#   num_blocks, block_size                        (PoolReset; 0 when the pool is gone)
#
# One entry per command rather than per event: a decoding executor stores and evicts about two
# thousand blocks a second, and an XADD each was most of what durability cost the allocator.
# The array is written by the compiled core (core/event_json.py): as text rather than through
# json.dumps of a dict per event, and the tokens as hex rather than an array of numbers.

EVENT_TYPES_BY_TEXT = {name: type_ for type_, name in EVENT_TYPE_TEXT.items()}


def events_xadd(keys: Keys, events: PackedEvents, trim_below: int | None
                ) -> tuple[str | bytes | int, ...]:
    """The XADD (its arguments) of the entry that holds `events` (consecutive, at least one),
    trimming the entries before entry `trim_below` (approximately: Redis trims whole nodes)."""
    trim = ("MINID", "~", entry_id(trim_below)) if trim_below is not None else ()
    return ("XADD", keys.events, *trim, entry_id(events.first_seq), b"count", events.count,
            b"events", encode_events(events))


def entry_last_seq(entry_id_: bytes, fields: dict[bytes, bytes]) -> int:
    """The number of the last event an entry holds."""
    return seq_of(entry_id_) + int(fields[b"count"]) - 1


def events_from_entry(entry_id_: bytes, fields: dict[bytes, bytes]) -> list[KvEvent]:
    first = seq_of(entry_id_)
    return [_event_from_object(first + index, item)
            for index, item in enumerate(json.loads(fields[b"events"]))]


def _event_from_object(seq: int, item: dict[str, Any]) -> KvEvent:
    type_ = EVENT_TYPES_BY_TEXT[item["type"]]
    if type_ == KvEventType.POOL_RESET:
        return KvEvent(seq, type_, item["executor"], reason=item["reason"],
                       num_blocks=item["num_blocks"], block_size=item["block_size"])
    if "tokens" in item:  # written before the tokens were packed
        token_ids = tuple(item["tokens"])
    else:
        token_ids = unpack_tokens(PackedTokens(bytes.fromhex(item.get("packed_tokens", ""))))
    return KvEvent(seq, type_, item["executor"], block_id=item["block"],
                   block_hash=bytes.fromhex(item["hash"]),
                   parent_hash=bytes.fromhex(item.get("parent", "")), token_ids=token_ids)
