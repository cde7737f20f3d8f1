"""KV events as JSON text: the array that one entry of a durable allocator's event stream holds
(its fields are described in durability/redis_codec.py, which writes and reads the entries).

Here, beside the packed events it reads, so that it is compiled with the core: a durable Step
writes about a hundred events, and a fleet's allocator writes thousands of Steps a second.
Compiled, a Step's 112 events (69 stored, 43 removed) take 29 µs instead of 39 interpreted.
"""
from __future__ import annotations

import json

from allocator_service.core.kv_events import (PACKED_REMOVED, PACKED_STORED, KvEventType,
                                              PackedEvents, records)

# The `type` member of each kind of event (encode_events writes them into its text).
EVENT_TYPE_TEXT: dict[KvEventType, str] = {KvEventType.BLOCK_STORED: "BlockStored",
                                           KvEventType.BLOCK_REMOVED: "BlockRemoved",
                                           KvEventType.POOL_RESET: "PoolReset"}


def encode_events(events: PackedEvents) -> bytes:
    """The events as one JSON array of objects, in order. Written as text rather than through
    json.dumps of a dict per event, and the tokens as hex rather than an array of numbers."""
    names: dict[bytes, str] = {}  # executor id -> its JSON string (a Step's events share one)
    parts: list[str] = []
    for event in records(events):
        type_: int = event[1]
        packed_executor_id: bytes = event[2]
        executor = names.get(packed_executor_id)
        if executor is None:
            executor = json.dumps(packed_executor_id.decode())
            names[packed_executor_id] = executor
        if type_ == PACKED_STORED:
            block_id: int = event[3]
            block_hash: bytes = event[4]
            parent_hash: bytes = event[5]
            tokens: bytes = event[6]
            parts.append(f'{{"type":"BlockStored","executor":{executor},"block":{block_id},'
                         f'"hash":"{block_hash.hex()}","parent":"{parent_hash.hex()}",'
                         f'"packed_tokens":"{tokens.hex()}"}}')
        elif type_ == PACKED_REMOVED:
            removed_id: int = event[3]
            removed_hash: bytes = event[4]
            parts.append(f'{{"type":"BlockRemoved","executor":{executor},"block":{removed_id},'
                         f'"hash":"{removed_hash.hex()}"}}')
        else:
            reason: str = event[3]
            num_blocks: int = event[4]
            block_size: int = event[5]
            parts.append(f'{{"type":"PoolReset","executor":{executor},'
                         f'"reason":{json.dumps(reason)},"num_blocks":{num_blocks},'
                         f'"block_size":{block_size}}}')
    return ("[" + ",".join(parts) + "]").encode()
