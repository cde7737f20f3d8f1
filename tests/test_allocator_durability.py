"""Durability of the allocator's state in Redis, against real processes only (no mocks).

A durable allocator (`--state-url`) journals every change to Redis before it replies. These tests
kill it with SIGKILL and start a new one on the same Redis, stop and restart Redis under it (with
and without persistence), start it before Redis exists, and read the KV event stream back, then
compare everything the admin API shows: pools, block tables, free-list (LRU) order, reference
counts, hash index, epochs, counters, recorded step results and events.

The expected state after a crash is the state before it, and, where a workload continues, that
of an in-memory allocator that never crashed and was given the same requests.
"""
from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import grpc
import pytest
import redis
from google.protobuf import text_format
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

import redis_process
from allocator_process import READY_PREFIX, REPO_ROOT, AllocatorProcess, hermetic_env
from allocator_service.block_hash import chain_hash
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.client import open_channel
from redis_process import RedisProcess, free_port
from wire_helpers import (ADMIN, ALLOCATOR, Code, Executor, allocate, append, fork, free,
                          health_status, register, rpc_error)

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which(redis_process.REDIS_SERVER) is None,
                       reason="redis-server is not installed"),
]

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


EVENT_TYPES = {b"BlockStored": STORED, b"BlockRemoved": REMOVED, b"PoolReset": POOL_RESET}
EVENT_FIELDS = {
    STORED: {b"type", b"executor", b"block", b"hash", b"parent", b"tokens"},
    REMOVED: {b"type", b"executor", b"block", b"hash"},
    POOL_RESET: {b"type", b"executor", b"reason", b"num_blocks", b"block_size"},
}


def redis_events(client: redis.Redis, namespace: str = NAMESPACE) -> list[pb.KvEvent]:
    """The events stream read straight from Redis and decoded as docs/durability.md describes
    it (not with the allocator's own codec)."""
    events = []
    for entry_id, fields in client.xrange(f"{namespace}:events"):
        seq, sub = entry_id.split(b"-")
        assert sub == b"0", entry_id
        kind = EVENT_TYPES[fields[b"type"]]
        assert set(fields) == EVENT_FIELDS[kind], (entry_id, fields)
        event = pb.KvEvent(seq=int(seq), type=kind, executor_id=fields[b"executor"].decode())
        if kind == POOL_RESET:
            event.reason = fields[b"reason"].decode()
            event.num_blocks = int(fields[b"num_blocks"])
            event.block_size = int(fields[b"block_size"])
        else:
            event.block_id = int(fields[b"block"])
            event.block_hash = bytes.fromhex(fields[b"hash"].decode())
        if kind == STORED:
            event.parent_block_hash = bytes.fromhex(fields[b"parent"].decode())
            event.token_ids.extend(int(token) for token in fields[b"tokens"].split(b","))
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
    return int(client.hget(f"{namespace}:meta", "snapshot_seq") or 0)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Polls until `condition` holds; returns the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(0.05)
    return time.monotonic() - started


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


# -- kill -9 and restart -------------------------------------------------------------------------

def test_kill_9_after_a_mixed_workload_restarts_into_the_identical_state(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess],
        allocator: AllocatorProcess) -> None:
    durable = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    executors = register_pools(stub)
    sent = run_workload(executors, MIXED_WORKLOAD)
    assert outcomes(response for _, response in sent) == MIXED_WORKLOAD_OUTCOMES

    # An in-memory allocator given the same requests: journaling changes no result.
    ref_stub, ref_admin = stubs(allocator)
    reference = register_pools(ref_stub)
    assert [ex.epoch for ex in reference.values()] == [ex.epoch for ex in executors.values()]
    assert [response for _, response in run_workload(reference, MIXED_WORKLOAD)] == [
        response for _, response in sent]
    before = observed_state(admin)
    assert before == observed_state(ref_admin)
    assert_audit_clean(admin)
    # The LRU holds cached-free blocks and some blocks are shared: there is order to lose.
    assert "state: BLOCK_STATE_CACHED_FREE" in before["blocks"][0]
    assert "ref_count: 3" in before["blocks"][1]  # b2, b3 and b5 share the prefix
    events_before = rpc_events(admin)
    # Refused steps change nothing, so nothing of them is journaled.
    gpu_a = executors["gpu-a"]
    assert rpc_error(lambda: stub.Step(gpu_a.request(99, pb.BlockOp()), timeout=5)).code() == (
        Code.INVALID_ARGUMENT)
    assert rpc_error(lambda: Executor(stub, "gpu-a", gpu_a.epoch + 5).step(free("a4"))).code() == (
        Code.FAILED_PRECONDITION)
    client = redis_server.client()
    assert journal(client) == [(1, "register"), (2, "register")] + [
        (seq, "step") for seq in range(3, 3 + len(MIXED_WORKLOAD))]
    assert applied_seq(admin) == 2 + len(MIXED_WORKLOAD)
    assert snapshot_seq(client) == 0  # the default --snapshot-every is far away

    kill_9(durable)
    recovered = durable_allocator(redis_server.url)
    stub, admin = stubs(recovered)
    assert observed_state(admin) == before
    assert applied_seq(admin) == 2 + len(MIXED_WORKLOAD)
    assert rpc_events(admin) == events_before
    assert_audit_clean(admin)

    # The reply to the last step died with the process; its retry (and that of every earlier
    # step) gets the recorded result, and applies nothing.
    executors = reattach(executors, stub)
    retry_all(executors, sent)
    assert observed_state(admin) == before
    assert len(journal(client)) == 2 + len(MIXED_WORKLOAD)  # answered, not journaled

    # The old epochs still work: the recovered allocator and the one that never crashed give the
    # same answers, end in the same state, and number their events alike.
    continued = run_workload(executors, CONTINUATION)
    assert [response for _, response in continued] == [
        response for _, response in run_workload(reference, CONTINUATION)]
    assert outcomes(response for _, response in continued) == [
        [(OK, 0, 0), (OK, 12, 0)], [(OK, 0, 0), (OK, 0, 1), (OK, 0, 0)], [(OK, 0, 0)],
        [(OK, 0, 0), (OK, 0, 0), (OK, 0, 0)]]
    assert observed_state(admin) == observed_state(ref_admin)
    assert rpc_events(admin) == rpc_events(ref_admin)
    assert_audit_clean(admin)


def test_kill_9_recovers_through_snapshot_plus_journal_tail(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url, "--snapshot-every", "5")
    stub, admin = stubs(durable)
    executors = register_pools(stub)
    sent = run_workload(executors, MIXED_WORKLOAD)
    client = redis_server.client()
    snapshot_at = settled_snapshot_seq(client)
    if snapshot_at == applied_seq(admin):
        # A snapshot caught up with the last command: one more step gives the journal a tail.
        sent += run_workload(executors, [("gpu-b", [append("b5", [50])])])
    applied = applied_seq(admin)
    assert 0 < snapshot_at < applied
    # The snapshot trimmed the journal: what remains is exactly the commands after it.
    assert [seq for seq, _ in journal(client)] == list(range(snapshot_at + 1, applied + 1))
    assert client.hget(f"{NAMESPACE}:meta", "format") == b"1"
    before = observed_state(admin)
    events_before = rpc_events(admin)

    kill_9(durable)
    recovered = durable_allocator(redis_server.url, "--snapshot-every", "5")
    stub, admin = stubs(recovered)
    assert (f"snapshot at {snapshot_at}, {applied - snapshot_at} journal entries replayed"
            in recovered.stderr_tail())
    assert observed_state(admin) == before
    assert applied_seq(admin) == applied
    assert rpc_events(admin) == events_before
    # Records of steps inside the snapshot and of steps replayed from the journal alike.
    executors = reattach(executors, stub)
    retry_all(executors, sent)
    continued = run_workload(executors, CONTINUATION[:2])
    assert outcomes(response for _, response in continued) == [
        [(OK, 0, 0), (OK, 12, 0)], [(OK, 0, 0), (OK, 0, 1), (OK, 0, 0)]]
    assert_audit_clean(admin)


# -- KV events ------------------------------------------------------------------------------------

def test_replaying_the_event_stream_from_the_start_rebuilds_every_hash_index_exactly(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    small = register(stub, "ev-small", num_blocks=6, block_size=4)
    other = register(stub, "ev-other", num_blocks=8, block_size=2)
    p, q, r = list(range(10)), list(range(100, 109)), list(range(200, 220))
    small.step(allocate("p", p), append("p", num_computed_tokens=10))  # stores 2 blocks
    small.step(free("p"))  # ... which wait cached-free in the LRU
    small.step(allocate("q", q), append("q", num_computed_tokens=9), free("q"))  # 2 more
    # r needs 5 of the 6 blocks: 3 of the 4 cached-free ones are evicted (q's first survives).
    assert list(small.step(allocate("r", r)).results[0].block_table) == [4, 5, 1, 0, 3]
    small.step(append("r", num_computed_tokens=20), free("r"))  # 5 more
    # t hits q's first block; its 2 new blocks evict r's last two.
    assert list(small.step(allocate("t", q)).results[0].block_table) == [2, 3, 0]
    small.step(append("t", num_computed_tokens=9))  # t's second block is stored again
    other.step(allocate("o", list(range(300, 306))), append("o", num_computed_tokens=6))
    assert admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(executor_id="ev-other"),
                                  timeout=5).num_entries_dropped == 3
    other.step(append("o", [306, 307], num_computed_tokens=8))  # stored after the reset
    other = register(stub, "ev-other", num_blocks=8, block_size=2)  # a new, empty pool
    other.step(allocate("o2", list(range(400, 405))), append("o2", num_computed_tokens=4))

    events = rpc_events(admin)
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert events == redis_events(redis_server.client())
    assert collections.Counter((e.type, e.executor_id, e.reason) for e in events) == {
        (POOL_RESET, "ev-small", "registered"): 1,
        (POOL_RESET, "ev-other", "registered"): 2,
        (POOL_RESET, "ev-other", "prefix_cache_reset"): 1,
        (STORED, "ev-small", ""): 2 + 2 + 5 + 1,
        (REMOVED, "ev-small", ""): 3 + 2,
        (STORED, "ev-other", ""): 3 + 1 + 2,
    }
    index = replay(events)
    assert index == cached_blocks(admin)
    # ev-small: q's first block, r's first three, t's second; ev-other: o2's two.
    assert sorted((executor_id, block_id) for (executor_id, _), (block_id, _) in index.items()) == [
        ("ev-other", 0), ("ev-other", 1),
        ("ev-small", 1), ("ev-small", 2), ("ev-small", 3), ("ev-small", 4), ("ev-small", 5)]

    # From a sequence number on: exactly the tail.
    for from_seq in (1, 7, len(events), len(events) + 1):
        assert rpc_events(admin, from_seq) == events[from_seq - 1:]

    # The journal replays resets and re-registrations to the same pools and numbering.
    before = observed_state(admin)
    kill_9(durable)
    stub, admin = stubs(durable_allocator(redis_server.url))
    assert observed_state(admin) == before
    assert rpc_events(admin) == events
    executor = Executor(stub, "ev-other", other.epoch, other.step_ids)
    executor.step(append("o2", [405], num_computed_tokens=6))
    assert [(e.seq, e.type, e.executor_id) for e in rpc_events(admin, len(events) + 1)] == [
        (len(events) + 1, STORED, "ev-other")]
    assert replay(rpc_events(admin)) == cached_blocks(admin)


def test_following_the_event_stream_delivers_an_event_made_after_the_call_started(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    executor = register(stub, "follower", num_blocks=8, block_size=4)
    executor.step(allocate("a", list(range(9))))
    last = rpc_events(admin)[-1].seq

    received: list[pb.KvEvent] = []
    failures: list[grpc.StatusCode] = []
    call = admin.StreamEvents(pb.StreamEventsRequest(from_seq=last + 1, follow=True), timeout=30)

    def follow() -> None:
        try:
            for event in call:
                received.append(event)
        except grpc.RpcError as error:
            failures.append(error.code())

    reader = threading.Thread(target=follow, name="event-follower", daemon=True)
    reader.start()
    time.sleep(0.3)  # the call is open and waiting before the events exist
    assert received == []
    executor.step(append("a", num_computed_tokens=9))  # stores 2 blocks: 2 events
    wait_for(lambda: len(received) == 2, 5, "2 followed events")
    call.cancel()
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert failures == [Code.CANCELLED]
    assert received == rpc_events(admin, last + 1)
    assert [(e.seq, e.type) for e in received] == [(last + 1, STORED), (last + 2, STORED)]


# -- Redis outages --------------------------------------------------------------------------------

def test_redis_outage_refuses_changes_serves_reads_and_recovers_without_divergence(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    channel = durable.channel()
    executor = register(stub, "x", num_blocks=8, block_size=4)
    first = executor.step(allocate("a", list(range(6))), append("a", [6, 7], num_computed_tokens=8))
    assert list(first.results[0].block_table) == [0, 1]

    redis_server.kill()  # appendfsync always: what it acknowledged is on disk
    lost_reply = executor.request(next(executor.step_ids), allocate("b", list(range(10, 15))))
    error = rpc_error(lambda: stub.Step(lost_reply, timeout=5))
    assert error.code() == Code.UNAVAILABLE
    assert f"state store {redis_server.url} did not take this change" in error.details()
    wait_for(not_serving(channel), 2, "health NOT_SERVING")
    for service in (ALLOCATOR, ADMIN):
        assert health_status(channel, service) == NOT_SERVING

    # Every change is refused, the retry of the failed step included...
    for refused in (lambda: stub.Step(lost_reply, timeout=5),
                    lambda: stub.Step(executor.request(lost_reply.step_id + 1, free("a")),
                                      timeout=5),
                    lambda: register(stub, "y"),
                    lambda: admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(), timeout=5)):
        error = rpc_error(refused)
        assert error.code() == Code.UNAVAILABLE
        assert f"state store {redis_server.url} is unavailable" in error.details()
    error = rpc_error(lambda: rpc_events(admin))
    assert (error.code(), f"cannot read KV events from {redis_server.url}" in error.details()) == (
        Code.UNAVAILABLE, True)
    # ... while reads and heartbeats answer from memory, where the failed step has applied.
    executor.heartbeat()
    assert [s.seq_id for s in admin.ListSequences(pb.ListSequencesRequest(), timeout=5)
            .sequences] == ["a", "b"]
    assert stub.MatchPrefix(pb.MatchPrefixRequest(token_ids=list(range(9))),
                            timeout=5).executors[0].num_cached_tokens == 8
    assert list(admin.DumpBlocks(pb.DumpBlocksRequest(executor_id="x"),
                                 timeout=5).free_list) == [4, 5, 6, 7]
    assert_audit_clean(admin)
    during = observed_state(admin)

    redis_server.restart()
    wait_for(serving(channel), 5, "health SERVING after Redis came back")
    # The failed step was written on recovery, so its retry is answered from the record.
    assert [seq for seq, _ in journal(redis_server.client())] == [1, 2, 3]
    retried = stub.Step(lost_reply, timeout=5)
    assert retried.replayed
    assert list(retried.results[0].block_table) == [2, 3]
    assert observed_state(admin) == during

    assert list(executor.step(allocate("c", list(range(4))), append("a", [8])).results[0]
                .block_table) == [4]
    executor.step(free("b"), fork("a", "a2"), append("a2", [9]))
    assert_audit_clean(admin)
    before = observed_state(admin)
    events_before = rpc_events(admin)

    kill_9(durable)
    recovered = durable_allocator(redis_server.url)
    _, admin = stubs(recovered)
    assert observed_state(admin) == before
    assert rpc_events(admin) == events_before


def test_step_refused_during_an_outage_dies_with_the_allocator_and_its_retry_applies_once(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    executor = register(stub, "x", num_blocks=8, block_size=4)
    executor.step(allocate("a", list(range(6))))
    before = observed_state(admin)

    redis_server.kill()
    unacknowledged = executor.request(next(executor.step_ids), allocate("b", list(range(10, 15))),
                                      append("a", [6, 7], num_computed_tokens=8))
    assert rpc_error(lambda: stub.Step(unacknowledged, timeout=5)).code() == Code.UNAVAILABLE
    kill_9(durable)  # the step only ever lived in its memory
    redis_server.restart()

    stub, admin = stubs(durable_allocator(redis_server.url))
    assert observed_state(admin) == before
    retried = stub.Step(unacknowledged, timeout=5)
    assert not retried.replayed  # applied now, once
    assert outcomes([retried]) == [[(OK, 0, 0), (OK, 0, 0)]]
    assert list(retried.results[0].block_table) == [2, 3]
    assert journal(redis_server.client()) == [(1, "register"), (2, "step"), (3, "step")]
    # The lost step's events were never published; their numbers are given out again.
    assert [(e.seq, e.type) for e in rpc_events(admin)] == [(1, POOL_RESET), (2, STORED),
                                                            (3, STORED)]


def test_state_url_password_never_shows_in_errors_stats_or_logs(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    password = "s3cret-Pa55"
    redis_server.client().config_set("requirepass", password)
    hidden = f"redis://:***@127.0.0.1:{redis_server.port}/0"
    durable = durable_allocator(f"redis://:{password}@127.0.0.1:{redis_server.port}/0")
    stub, admin = stubs(durable)
    executor = register(stub, "x")
    assert admin.GetStats(pb.GetStatsRequest(), timeout=5).state_store == hidden

    redis_server.kill()
    details = [rpc_error(lambda: executor.step(allocate("a", [1]))).details(),
               rpc_error(lambda: rpc_events(admin)).details()]
    wait_for(not_serving(durable.channel()), 2, "health NOT_SERVING")
    details.append(rpc_error(lambda: executor.step(allocate("b", [1]))).details())
    assert all(hidden in text and password not in text for text in details), details
    durable.stop()
    assert hidden in durable.stderr_tail(500)
    assert password not in durable.stderr_tail(500)


def test_events_stream_that_lost_its_tail_is_resynced_on_start(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    run_workload(register_pools(stub), MIXED_WORKLOAD)
    events = rpc_events(admin)
    before = observed_state(admin)
    kill_9(durable)
    client = redis_server.client()
    # Redis lost the newest 3 events (an older append-only file, say); the journal is whole.
    assert client.xdel(f"{NAMESPACE}:events", *[f"{e.seq}-0" for e in events[-3:]]) == 3

    recovered = durable_allocator(redis_server.url)
    _, admin = stubs(recovered)
    assert observed_state(admin) == before
    assert (f"lost data (event stream ends at {events[-4].seq}, state at {events[-1].seq})"
            in recovered.stderr_tail())
    stored = redis_events(client)
    assert stored[:len(events) - 3] == events[:-3]
    resynced = stored[len(events) - 3:]
    assert [e.seq for e in resynced] == list(range(events[-1].seq + 1,
                                                   events[-1].seq + 1 + len(resynced)))
    assert [(e.executor_id, e.reason) for e in resynced if e.type == POOL_RESET] == [
        ("gpu-a", "resync"), ("gpu-b", "resync")]
    assert replay(stored) == cached_blocks(admin)
    assert rpc_events(admin) == stored
    # The resync came with a fresh snapshot of the loaded state.
    assert snapshot_seq(client) == 2 + len(MIXED_WORKLOAD)
    assert journal(client) == []


def test_redis_restarted_empty_is_reseeded_from_memory(
        tmp_path: Path, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    with RedisProcess(tmp_path / "volatile", appendonly=False) as volatile:
        durable = durable_allocator(volatile.url)
        stub, admin = stubs(durable)
        channel = durable.channel()
        executors = register_pools(stub)
        run_workload(executors, MIXED_WORKLOAD)
        last_event = rpc_events(admin)[-1].seq
        applied = applied_seq(admin)

        volatile.kill()
        # Made while Redis is away: applied in memory, never acknowledged, one BlockStored event.
        unacknowledged = executors["gpu-a"].request(next(executors["gpu-a"].step_ids),
                                                    append("a4", [25], num_computed_tokens=16))
        assert rpc_error(lambda: stub.Step(unacknowledged, timeout=5)).code() == Code.UNAVAILABLE
        wait_for(not_serving(channel), 2, "health NOT_SERVING")
        volatile.restart()  # no append-only file: it comes back empty
        wait_for(serving(channel), 5, "health SERVING after the reseed")

        client = volatile.client()
        # A fresh snapshot of memory (the unacknowledged step included) and no journal.
        assert snapshot_seq(client) == applied + 1
        assert journal(client) == []
        assert "lost data" in durable.stderr_tail()
        retried = stub.Step(unacknowledged, timeout=5)
        assert retried.replayed and retried.results[0].status == OK

        # The stream now starts with a resync of each pool, right after the event of the
        # unacknowledged step (which the resync covers), then every entry of that pool.
        events = redis_events(client)
        assert events[0].seq == last_event + 2
        assert [event.seq for event in events] == list(
            range(last_event + 2, last_event + 2 + len(events)))
        index = cached_blocks(admin)
        resets = [i for i, event in enumerate(events) if event.type == POOL_RESET]
        assert [(events[i].executor_id, events[i].reason, events[i].num_blocks,
                 events[i].block_size) for i in resets] == [
            ("gpu-a", "resync", 16, 4), ("gpu-b", "resync", 10, 8)]
        for start, end in zip(resets, [*resets[1:], len(events)]):
            executor_id = events[start].executor_id
            assert {(e.executor_id, e.block_hash): (e.block_id, e.parent_block_hash)
                    for e in events[start + 1:end] if e.type == STORED} == {
                key: value for key, value in index.items() if key[0] == executor_id}
            assert all(e.type == STORED for e in events[start + 1:end])
        assert replay(events) == index
        assert rpc_events(admin) == events

        # Changes go to the reseeded store; a crash now restarts into the same state.
        run_workload(executors, CONTINUATION)
        assert replay(redis_events(client)) == cached_blocks(admin)
        before = observed_state(admin)
        kill_9(durable)
        _, admin = stubs(durable_allocator(volatile.url))
        assert observed_state(admin) == before
        assert_audit_clean(admin)


def test_allocator_started_before_redis_refuses_everything_until_redis_appears(
        tmp_path: Path) -> None:
    # AllocatorProcess waits for SERVING, which cannot happen here: run the process by hand.
    port = free_port()
    state_url = f"redis://127.0.0.1:{port}/0"
    stderr_path = tmp_path / "allocator.stderr"
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "allocator_service", "--host", "127.0.0.1", "--port", "0",
             "--state-url", state_url],
            cwd=REPO_ROOT, env=hermetic_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=stderr, text=True)
    redis_server = None
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(READY_PREFIX), stderr_path.read_text()
        channel = open_channel(line[len(READY_PREFIX):].strip())
        stub = pb_grpc.AllocatorStub(channel)
        admin = pb_grpc.AllocatorAdminStub(channel)
        for _ in range(2):  # right away, and still after a few load attempts
            assert health_status(channel, "") == NOT_SERVING
            for call in (lambda: admin.GetStats(pb.GetStatsRequest(), timeout=5),
                         lambda: register(stub, "early")):
                error = rpc_error(call)
                assert error.code() == Code.UNAVAILABLE
                assert f"state store {state_url} is unavailable (state not loaded yet" in (
                    error.details())
            time.sleep(1.5)
        assert process.poll() is None

        redis_server = RedisProcess(tmp_path / "redis", port=port)
        wait_for(serving(channel), 5, "health SERVING once Redis is up")
        assert register(stub, "late").epoch == 1
        assert admin.GetStats(pb.GetStatsRequest(), timeout=5).state_store == state_url
        assert journal(redis_server.client()) == [(1, "register")]
        channel.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()  # type: ignore[union-attr]
        if redis_server is not None:
            redis_server.close()


# -- leases and namespaces ------------------------------------------------------------------------

def test_lease_expiry_is_journaled_and_survives_a_restart(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url, "--lease-ttl", "0.5")
    stub, admin = stubs(durable)
    executor = register(stub, "lapsing", num_blocks=8, block_size=4)
    executor.step(allocate("a", list(range(8))), append("a", num_computed_tokens=8))
    wait_for(lambda: not admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors,
             3, "the lease to lapse")
    assert journal(redis_server.client()) == [(1, "register"), (2, "step"), (3, "reclaim")]

    kill_9(durable)
    recovered = durable_allocator(redis_server.url, "--lease-ttl", "0.5")
    stub, admin = stubs(recovered)
    assert list(admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors) == []
    assert rpc_error(lambda: Executor(stub, "lapsing", executor.epoch).step(
        free("a"))).code() == Code.NOT_FOUND
    assert [(e.type, e.executor_id, e.reason, e.num_blocks) for e in rpc_events(admin)] == [
        (POOL_RESET, "lapsing", "registered", 8), (STORED, "lapsing", "", 0),
        (STORED, "lapsing", "", 0), (POOL_RESET, "lapsing", "lease_expired", 0)]
    # Epochs go on from where they were: the reclaim did not give the old one back.
    assert register(stub, "lapsing").epoch == executor.epoch + 1


def test_allocators_on_other_namespaces_or_databases_keep_separate_state(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    settings = {  # name: (state url, extra flags)
        "team-a": (redis_server.url, ("--state-namespace", "team-a")),
        "team-b": (redis_server.url, ("--state-namespace", "team-b")),
        "db-1": (redis_server.url_for_db(1), ()),
    }
    started = {name: durable_allocator(url, *flags) for name, (url, flags) in settings.items()}
    states = {}
    for n, (name, allocator) in enumerate(started.items()):
        stub, admin = stubs(allocator)
        executor = register(stub, f"{name}-gpu", num_blocks=8, block_size=4)
        executor.step(allocate("s", list(range(4 * (n + 1) + 1))),
                      append("s", num_computed_tokens=4 * (n + 1)))
        states[name] = observed_state(admin)
        assert [e.executor_id for e in admin.ListExecutors(
            pb.ListExecutorsRequest(), timeout=5).executors] == [f"{name}-gpu"]
        # Each counts its own epochs and events from 1.
        assert executor.epoch == 1
        assert [e.seq for e in rpc_events(admin)] == list(range(1, n + 3))

    db0, db1 = redis_server.client(), redis_server.client(db=1)
    assert sorted(db0.keys()) == [b"team-a:events", b"team-a:journal", b"team-b:events",
                                  b"team-b:journal"]
    assert sorted(db1.keys()) == [f"{NAMESPACE}:events".encode(), f"{NAMESPACE}:journal".encode()]

    for allocator in started.values():
        kill_9(allocator)
    for name, (url, flags) in settings.items():
        _, admin = stubs(durable_allocator(url, *flags))
        assert observed_state(admin) == states[name], name


# -- one writer per namespace ---------------------------------------------------------------------

def two_allocators_on_the_same_keys(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]
) -> tuple[Executor, Executor, AllocatorProcess]:
    """`first` registers an executor; `second` starts on the same keys and loads it. Returns the
    executor as seen through each, and the second allocator."""
    first_stub, _ = stubs(durable_allocator(redis_server.url))
    through_first = register(first_stub, "shared", num_blocks=8, block_size=4)
    second = durable_allocator(redis_server.url)
    second_stub, _ = stubs(second)
    return through_first, Executor(second_stub, "shared", through_first.epoch), second


def test_second_allocator_on_the_same_keys_stays_down_when_the_other_is_ahead(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    through_first, through_second, second = two_allocators_on_the_same_keys(
        redis_server, durable_allocator)
    through_first.step(allocate("a", list(range(5))))
    through_first.step(allocate("b", list(range(5))))
    # The second allocator's journal entry 2 exists already: its write fails.
    assert rpc_error(lambda: through_second.step(allocate("c", list(range(5))))).code() == (
        Code.UNAVAILABLE)
    time.sleep(1.5)  # a few watchdog rounds: it must not come back
    assert health_status(second.channel(), "") == NOT_SERVING
    assert rpc_error(lambda: through_second.step(free("c"))).code() == Code.UNAVAILABLE
    assert "another allocator writes to the same keys" in second.stderr_tail()
    # The first one is unaffected, and the journal holds its commands only.
    through_first.step(free("a"))
    assert journal(redis_server.client()) == [(1, "register"), (2, "step"), (3, "step"),
                                              (4, "step")]


def test_second_allocator_on_the_same_keys_stays_down_when_the_other_is_one_entry_ahead(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    through_first, through_second, second = two_allocators_on_the_same_keys(
        redis_server, durable_allocator)
    through_first.step(allocate("a", list(range(5))))
    assert rpc_error(lambda: through_second.step(allocate("c", list(range(5))))).code() == (
        Code.UNAVAILABLE)
    time.sleep(1.5)
    # As when the other is further ahead. Observed instead: SERVING, and the next Step is
    # journaled as entry 3, after the other allocator's entry 2 that it took for its own.
    assert health_status(second.channel(), "") == NOT_SERVING
    assert rpc_error(lambda: through_second.step(allocate("d", list(range(5))))).code() == (
        Code.UNAVAILABLE)
    assert journal(redis_server.client()) == [(1, "register"), (2, "step")]
