"""Shared by the durability tests: a mixed workload with its exact outcomes, and helpers that
read a durable allocator's whole observable state (admin API, events, and Redis itself) so that
states before and after a crash compare with ==."""
from __future__ import annotations

import struct

import time
from collections.abc import Callable, Iterable, Sequence

import grpc
import redis
from google.protobuf import text_format
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from allocator_service.core.block_hash import chain_hash
from allocator_service.durability import redis_codec
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import (Executor, allocate, append, fork, free, health_status,
                                          register)

NAMESPACE = "pagedserve:allocator"  # the default --state-namespace
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STORED = pb.KV_EVENT_TYPE_BLOCK_STORED
REMOVED = pb.KV_EVENT_TYPE_BLOCK_REMOVED
POOL_RESET = pb.KV_EVENT_TYPE_POOL_RESET
OK = pb.OP_STATUS_OK
OUT_OF_BLOCKS = pb.OP_STATUS_OUT_OF_BLOCKS
NOT_FOUND = pb.OP_STATUS_NOT_FOUND
ALREADY_EXISTS = pb.OP_STATUS_ALREADY_EXISTS
TOO_LARGE = pb.OP_STATUS_TOO_LARGE

Index = dict[tuple[str, bytes], tuple[int, bytes]]
Workload = Sequence[tuple[str, Sequence[pb.BlockOp]]]


# -- the mixed workload ---------------------------------------------------------------------------
#
# Two pools of different geometry; prompts sharing a prefix that an earlier sequence reported
# computed (prefix hits), forks and writes into the shared tail (copy-on-write), lookahead,
# frees that leave cached-free blocks in the LRU, and ops that fail alone.

POOLS = {"gpu-a": (16, 4), "gpu-b": (10, 8)}  # executor id: (num_blocks, block_size)
PREFIX_A = list(range(1000, 1012))  # 3 full blocks of gpu-a
PREFIX_B = list(range(2000, 2016))  # 2 full blocks of gpu-b

MIXED_WORKLOAD: Workload = [
    ("gpu-a", [allocate("a1", PREFIX_A + [1, 2], lookahead_slots=3)]),
    ("gpu-b", [allocate("b1", PREFIX_B + [1, 2, 3])]),
    # Reported computed: the full prefix blocks enter the prefix caches.
    ("gpu-a", [append("a1", [3], num_computed_tokens=14)]),
    ("gpu-b", [append("b1", [4], num_computed_tokens=20)]),
    ("gpu-a", [allocate("a2", PREFIX_A + [4, 5, 6]), allocate("a3", PREFIX_A + [7]),
               fork("a2", "a2f"), append("ghost", [1]), allocate("a1", [9])]),
    ("gpu-b", [allocate("b2", PREFIX_B + [5]), fork("b2", "b3"), append("b3", [6])]),
    ("gpu-a", [append("a2f", [8]), append("a2", [9, 10]),
               append("a3", [11, 12, 13], num_computed_tokens=16)]),
    ("gpu-a", [allocate("big", list(range(50))), allocate("huge", list(range(100))),
               free("a1"), free("a3")]),
    ("gpu-b", [free("b1"), allocate("b4", list(range(3000, 3060)))]),
    ("gpu-a", [free("a2f"), free("nope"), free("a2")]),
    ("gpu-b", [allocate("b5", PREFIX_B + [7, 8], lookahead_slots=6),
               append("b2", [9], num_computed_tokens=18)]),
    # The last step before the crash: hits the prefix blocks that wait cached-free in the LRU.
    ("gpu-a", [allocate("a4", PREFIX_A + [20, 21, 22, 23, 24], lookahead_slots=2)]),
]

# What each op of MIXED_WORKLOAD answers: (status, num_cached_tokens, number of copies).
MIXED_WORKLOAD_OUTCOMES = [
    [(OK, 0, 0)],
    [(OK, 0, 0)],
    [(OK, 0, 0)],
    [(OK, 0, 0)],
    [(OK, 12, 0), (OK, 12, 0), (OK, 0, 0), (NOT_FOUND, 0, 0), (ALREADY_EXISTS, 0, 0)],
    [(OK, 16, 0), (OK, 0, 0), (OK, 0, 1)],
    [(OK, 0, 1), (OK, 0, 0), (OK, 0, 0)],
    [(OUT_OF_BLOCKS, 0, 0), (TOO_LARGE, 0, 0), (OK, 0, 0), (OK, 0, 0)],
    [(OK, 0, 0), (OUT_OF_BLOCKS, 0, 0)],
    [(OK, 0, 0), (NOT_FOUND, 0, 0), (OK, 0, 0)],
    [(OK, 16, 0), (OK, 0, 0)],
    [(OK, 12, 0)],
]

# Run after a recovery: hits again, copy-on-write in a recovered fork, an allocation that evicts
# every cached-free block, and frees.
CONTINUATION: Workload = [
    ("gpu-a", [append("a4", [25, 26], num_computed_tokens=19), allocate("a5", PREFIX_A + [30])]),
    ("gpu-b", [fork("b5", "b6"), append("b6", [40]), append("b5", [41], num_computed_tokens=19)]),
    ("gpu-a", [allocate("fill", list(range(5000, 5040)))]),
    ("gpu-a", [free("a4"), free("a5"), free("fill")]),
]


# -- helpers --------------------------------------------------------------------------------------

def stubs(allocator: AllocatorProcess
          ) -> tuple[pb_grpc.AllocatorStub, pb_grpc.AllocatorAdminStub]:
    channel = allocator.channel()
    return pb_grpc.AllocatorStub(channel), pb_grpc.AllocatorAdminStub(channel)


def kill_9(allocator: AllocatorProcess) -> None:
    """SIGKILL: no shutdown hook runs, nothing is flushed; then reap it and close its channels."""
    allocator.process.kill()
    allocator.process.wait()
    allocator.stop()


def register_pools(stub: pb_grpc.AllocatorStub) -> dict[str, Executor]:
    return {executor_id: register(stub, executor_id, num_blocks, block_size)
            for executor_id, (num_blocks, block_size) in POOLS.items()}


def reattach(executors: dict[str, Executor], stub: pb_grpc.AllocatorStub) -> dict[str, Executor]:
    """The same executors (epochs, step id counters) talking to another allocator process."""
    return {executor_id: Executor(stub, executor_id, ex.epoch, ex.step_ids)
            for executor_id, ex in executors.items()}


def run_workload(executors: dict[str, Executor],
                 workload: Workload) -> list[tuple[pb.StepRequest, pb.StepResponse]]:
    sent = []
    for executor_id, ops in workload:
        executor = executors[executor_id]
        request = executor.request(next(executor.step_ids), *ops)
        sent.append((request, executor.stub.Step(request, timeout=5)))
    return sent


def outcomes(responses: Iterable[pb.StepResponse]) -> list[list[tuple[int, int, int]]]:
    return [[(r.status, r.num_cached_tokens, len(r.copies)) for r in response.results]
            for response in responses]


def as_text(messages: Iterable[Message]) -> list[str]:
    return [text_format.MessageToString(message) for message in messages]


def observed_state(admin: pb_grpc.AllocatorAdminStub) -> dict[str, list[str]]:
    """Everything the admin API shows of the state, as text (readable diffs). Leases are left
    out: they start afresh with every allocator process."""
    executors = list(admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors)
    for info in executors:
        info.ClearField("lease_remaining_s")
    sequences = admin.ListSequences(pb.ListSequencesRequest(), timeout=5).sequences
    stats = admin.GetStats(pb.GetStatsRequest(), timeout=5)
    return {
        "executors": as_text(executors),
        "sequences": as_text(sequences),
        "block_tables": as_text(
            admin.GetBlockTable(pb.GetBlockTableRequest(executor_id=s.executor_id,
                                                        seq_id=s.seq_id), timeout=5)
            for s in sequences),
        "blocks": as_text(admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=e.executor_id),
                                           timeout=5) for e in executors),
        "stats": as_text([*stats.pools, stats.total]),
        "audit": as_text([admin.Audit(pb.AuditRequest(), timeout=5)]),
    }


def applied_seq(admin: pb_grpc.AllocatorAdminStub) -> int:
    return admin.GetStats(pb.GetStatsRequest(), timeout=5).applied_seq


def assert_audit_clean(admin: pb_grpc.AllocatorAdminStub) -> None:
    assert list(admin.Audit(pb.AuditRequest(), timeout=5).violations) == []


def rpc_events(admin: pb_grpc.AllocatorAdminStub, from_seq: int = 0) -> list[pb.KvEvent]:
    events = list(admin.StreamEvents(pb.StreamEventsRequest(from_seq=from_seq), timeout=10))
    for event in events:
        if event.type == POOL_RESET:
            # The RPC fills block_id with -1 on resets; no block is involved (Redis omits it).
            event.ClearField("block_id")
    return events


# The type byte of each record of an entry's `packed` field (docs/durability.md).
EXECUTOR_RECORD = 0


def redis_events(client: redis.Redis, namespace: str = NAMESPACE) -> list[pb.KvEvent]:
    """The events stream read straight from Redis and decoded as docs/durability.md describes
    it (with `struct`, not the allocator's own codec): one entry per command, its id the number
    of its first event, fields `count` and `packed` (little-endian records)."""
    events = []
    for entry_id, fields in client.xrange(f"{namespace}:events"):
        first, sub = entry_id.split(b"-")
        assert sub == b"0" and set(fields) == {b"count", b"packed"}, (entry_id, fields)
        entry = _packed_entry_events(int(first), fields[b"packed"])
        assert len(entry) == int(fields[b"count"]) > 0
        events += entry
    return events


def _packed_entry_events(first_seq: int, data: bytes) -> list[pb.KvEvent]:
    events: list[pb.KvEvent] = []
    at, executor = 0, None

    def take(size: int) -> bytes:
        nonlocal at
        assert at + size <= len(data), f"a record runs past the entry ({at} + {size})"
        at += size
        return data[at - size:at]

    def i32() -> int:
        return struct.unpack("<i", take(4))[0]

    while at < len(data):
        kind = take(1)[0]
        if kind == EXECUTOR_RECORD:
            executor = take(i32()).decode()
            continue
        assert executor is not None, "an entry starts with its executor"
        event = pb.KvEvent(seq=first_seq + len(events), type=kind, executor_id=executor)
        if kind == POOL_RESET:
            event.reason = take(i32()).decode()
            event.num_blocks, event.block_size = struct.unpack("<qq", take(16))
        else:
            assert kind in (STORED, REMOVED), kind
            event.block_id = i32()
            event.block_hash = take(take(1)[0])
        if kind == STORED:
            event.parent_block_hash = take(take(1)[0])
            packed = take(i32())  # the token ids as little-endian uint32
            event.token_ids.extend(struct.unpack(f"<{len(packed) // 4}I", packed))
        events.append(event)
    return events


def replay(events: Iterable[pb.KvEvent]) -> Index:
    """What a router following the events holds: (executor, hash) -> (block id, parent hash)."""
    index: Index = {}
    for event in events:
        key = (event.executor_id, event.block_hash)
        if event.type == STORED:
            # A stored hash is the chained hash of its parent and tokens: routers recompute it.
            assert chain_hash(event.parent_block_hash, event.token_ids) == event.block_hash
            index[key] = (event.block_id, event.parent_block_hash)
        elif event.type == REMOVED:
            assert index.pop(key)[0] == event.block_id, event
        else:
            index = {k: v for k, v in index.items() if k[0] != event.executor_id}
    return index


def cached_blocks(admin: pb_grpc.AllocatorAdminStub) -> Index:
    """The hash index of every pool, as DumpBlocks shows it."""
    index: Index = {}
    for executor in admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors:
        dump = admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=executor.executor_id), timeout=5)
        for block in dump.blocks:
            if block.block_hash:
                index[(executor.executor_id, block.block_hash)] = (block.block_id,
                                                                    block.parent_block_hash)
    return index


def journal(client: redis.Redis, namespace: str = NAMESPACE) -> list[tuple[int, str]]:
    """(seq, kind) of every journal entry in Redis."""
    return [(int(entry_id.split(b"-")[0]), fields[b"kind"].decode())
            for entry_id, fields in client.xrange(f"{namespace}:journal")]


def snapshot_seq(client: redis.Redis, namespace: str = NAMESPACE) -> int:
    return redis_codec.stored_snapshot_seq(client, redis_codec.Keys.under(namespace))


def serving(channel: grpc.Channel) -> Callable[[], bool]:
    return lambda: health_status(channel, "") == SERVING


def not_serving(channel: grpc.Channel) -> Callable[[], bool]:
    return lambda: health_status(channel, "") == NOT_SERVING


def settled_snapshot_seq(client: redis.Redis, quiet_s: float = 0.5) -> int:
    """snapshot_seq once the background writer has been quiet for `quiet_s` (snapshots are
    written off the request path, a few milliseconds after the commit that triggers them)."""
    last, since = snapshot_seq(client), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        current = snapshot_seq(client)
        if current != last:
            last, since = current, time.monotonic()
    return last


def retry_all(executors: dict[str, Executor],
              sent: Sequence[tuple[pb.StepRequest, pb.StepResponse]]) -> None:
    """Every step sent again, byte for byte, is answered from its record: same results, replayed."""
    for request, response in sent:
        retried = executors[request.executor_id].stub.Step(request, timeout=5)
        assert retried.replayed, request
        retried.replayed = False
        assert retried == response, request

