"""How the allocator's state looks in Redis: the keys, and the encoding of what is under them.

    {ns}:journal    stream, entry id "<seq>-0", fields kind, body: every command since the
                    snapshot, in order (see commands.py)
    {ns}:snapshot   list: zlib-compressed JSON of the whole state at seq `snapshot_seq`, in
                    pieces of at most SNAPSHOT_PIECE bytes (a string, before 2026-11-28)
    {ns}:meta       hash: snapshot_seq, format
    {ns}:snapshot:next  list: a snapshot being written, a piece per command, then renamed to
                    {ns}:snapshot (snapshot_writer.py)
    {ns}:events     stream capped at about --events-max events: one entry per command (a
                    Step's events go in one XADD), entry id "<seq of its first event>-0",
                    fields count and packed (below)

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
from allocator_service.core.kv_events import (KvEvent, KvEventType, PackedEvents, records,
                                              unpack_record)
from allocator_service.durability.commands import Command

DEFAULT_NAMESPACE = "pagedserve:allocator"

@dataclass(slots=True, frozen=True)
class Keys:
    journal: str
    snapshot: str
    meta: str
    events: str
    snapshot_next: str

    @classmethod
    def under(cls, namespace: str) -> Keys:
        return cls(f"{namespace}:journal", f"{namespace}:snapshot", f"{namespace}:meta",
                   f"{namespace}:events", f"{namespace}:snapshot:next")


# A snapshot is stored in pieces of at most this many bytes, each its own list element: see
# snapshot_writer.write_if_newer for why.
SNAPSHOT_PIECE = 1 << 20


def snapshot_pieces(blob: bytes) -> list[bytes]:
    return [blob[start:start + SNAPSHOT_PIECE]
            for start in range(0, max(1, len(blob)), SNAPSHOT_PIECE)]


def stored_snapshot_seq(client: Any, keys: Keys) -> int:
    """The journal entry the stored snapshot was taken at; 0 when there is none. `client` may
    be a pipeline in immediate mode (after WATCH)."""
    return int(client.hget(keys.meta, "snapshot_seq") or 0)


def read_snapshot(client: redis.Redis, key: str) -> bytes | None:
    """The stored snapshot's bytes (its pieces joined), or None when there is none. A snapshot
    stored as one string (before 2026-11-28) reads too."""
    kind = client.type(key)
    if kind in (b"string", "string"):
        return client.get(key)  # type: ignore[return-value]
    if kind in (b"list", "list"):
        return b"".join(client.lrange(key, 0, -1))  # type: ignore[arg-type]
    return None


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
# `packed`, the events' records exactly as the core packed them (core/kv_events.py), written
# without re-encoding. Little-endian, each record starting with its type byte:
#
#   0  executor       i32 length + UTF-8 id: the executor of the records that follow (an
#                     entry starts with one)
#   1  BlockStored    i32 block id, u8 length + hash, u8 length + parent hash (the chain root
#                     for a first block), i32 length in bytes + the token ids as uint32
#   2  BlockRemoved   i32 block id, u8 length + hash
#   3  PoolReset      i32 length + UTF-8 reason, i64 num_blocks, i64 block_size
#
# One entry per command rather than per event: a decoding executor stores and evicts about two
# thousand blocks a second, and an XADD each was most of what durability cost the allocator.
# Until 2026-11-28 entries carried `events`, a JSON array of objects (type, executor, block,
# hash and parent in hex, packed_tokens in hex, reason, num_blocks, block_size; before
# 2026-11-25 `tokens`, an array of ids), still read here. Writing that text took 15 % of a
# durable fleet allocator's CPU (5 ms iterations, 22 executors) and tripled what Redis
# received, appended to its file and rewrote.

EVENT_TYPES_BY_TEXT = {"BlockStored": KvEventType.BLOCK_STORED,
                       "BlockRemoved": KvEventType.BLOCK_REMOVED,
                       "PoolReset": KvEventType.POOL_RESET}


def events_xadd(keys: Keys, events: PackedEvents, trim_below: int | None
                ) -> tuple[str | bytes | int, ...]:
    """The XADD (its arguments) of the entry that holds `events` (consecutive, at least one),
    trimming the entries before entry `trim_below` (approximately: Redis trims whole nodes)."""
    trim = ("MINID", "~", entry_id(trim_below)) if trim_below is not None else ()
    return ("XADD", keys.events, *trim, entry_id(events.first_seq), b"count", events.count,
            b"packed", events.data)


def entry_last_seq(entry_id_: bytes, fields: dict[bytes, bytes]) -> int:
    """The number of the last event an entry holds."""
    return seq_of(entry_id_) + int(fields[b"count"]) - 1


def events_from_entry(entry_id_: bytes, fields: dict[bytes, bytes]) -> list[KvEvent]:
    first = seq_of(entry_id_)
    if b"packed" in fields:
        packed = PackedEvents(first, int(fields[b"count"]), fields[b"packed"])
        return [unpack_record(record) for record in records(packed)]
    return [_event_from_object(first + index, item)  # an entry written as JSON
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
