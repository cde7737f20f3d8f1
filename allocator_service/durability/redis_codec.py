"""How the allocator's state looks in Redis: the keys, and the encoding of what is under them.

    {ns}:journal    stream, entry id "<seq>-0", fields kind, body: every command since the
                    snapshot, in order (see commands.py)
    {ns}:snapshot   string: zlib-compressed JSON of the whole state at seq `snapshot_seq`
    {ns}:meta       hash: snapshot_seq, format
    {ns}:events     stream capped at about --events-max entries, entry id "<event seq>-0":
                    the KV events, fields below

The stored state is the snapshot plus every journal entry after it. Entry ids are the sequence
numbers themselves, so `XRANGE {ns}:events 1200 +` reads from event 1200 on.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from allocator_service.core.kv_events import KvEvent, KvEventType
from allocator_service.durability.commands import Command

DEFAULT_NAMESPACE = "pagedserve:allocator"

EVENT_TYPE_NAMES = {KvEventType.BLOCK_STORED: b"BlockStored",
                    KvEventType.BLOCK_REMOVED: b"BlockRemoved",
                    KvEventType.POOL_RESET: b"PoolReset"}
EVENT_TYPES_BY_NAME = {name: type_ for type_, name in EVENT_TYPE_NAMES.items()}


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

def command_fields(command: Command) -> dict[bytes, bytes]:
    return {b"kind": command.kind.encode(), b"body": command.body}


def command_from_fields(fields: dict[bytes, bytes]) -> Command:
    return Command(fields[b"kind"].decode(), fields[b"body"])


# -- snapshot ----------------------------------------------------------------------------------

def encode_snapshot(data: dict[str, Any]) -> bytes:
    # Level 1: snapshots are mostly token ids and hex; faster levels compress them nearly as well.
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 1)


def decode_snapshot(blob: bytes) -> dict[str, Any]:
    return json.loads(zlib.decompress(blob))


# -- events ------------------------------------------------------------------------------------
#
#   type         BlockStored | BlockRemoved | PoolReset
#   executor     executor id
#   block        block id                       (BlockStored, BlockRemoved)
#   hash         block hash, hex                (BlockStored, BlockRemoved)
#   parent       parent block hash, hex         (BlockStored; the chain root for a first block)
#   tokens       token ids, comma-separated     (BlockStored)
#   reason       registered | lease_expired | prefix_cache_reset | resync   (PoolReset)
#   num_blocks, block_size                      (PoolReset; 0 when the pool is gone)

def event_fields(event: KvEvent) -> dict[bytes, bytes | str | int]:
    fields: dict[bytes, bytes | str | int] = {b"type": EVENT_TYPE_NAMES[event.type],
                                              b"executor": event.executor_id}
    if event.type == KvEventType.POOL_RESET:
        fields[b"reason"] = event.reason
        fields[b"num_blocks"] = event.num_blocks
        fields[b"block_size"] = event.block_size
        return fields
    fields[b"block"] = event.block_id
    fields[b"hash"] = event.block_hash.hex()
    if event.type == KvEventType.BLOCK_STORED:
        fields[b"parent"] = event.parent_hash.hex()
        fields[b"tokens"] = ",".join(map(str, event.token_ids))
    return fields


def event_from_fields(entry_id_: bytes, fields: dict[bytes, bytes]) -> KvEvent:
    type_ = EVENT_TYPES_BY_NAME[fields[b"type"]]
    common = {"seq": seq_of(entry_id_), "type": type_,
              "executor_id": fields[b"executor"].decode()}
    if type_ == KvEventType.POOL_RESET:
        return KvEvent(**common, reason=fields[b"reason"].decode(),  # type: ignore[arg-type]
                       num_blocks=int(fields[b"num_blocks"]),
                       block_size=int(fields[b"block_size"]))
    tokens = fields.get(b"tokens", b"")
    return KvEvent(**common, block_id=int(fields[b"block"]),  # type: ignore[arg-type]
                   block_hash=bytes.fromhex(fields[b"hash"].decode()),
                   parent_hash=bytes.fromhex(fields.get(b"parent", b"").decode()),
                   token_ids=tuple(map(int, tokens.split(b","))) if tokens else ())
