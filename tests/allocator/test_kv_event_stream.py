"""The KV event stream of a durable allocator: replaying it from the start (over the StreamEvents
RPC, or straight from Redis) rebuilds every pool's hash index exactly, `follow` delivers new
events, and a stream that lost its tail is resynced. Real processes only."""
from __future__ import annotations

import collections
import shutil
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.supervisor.redis_server import REDIS_SERVER, RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import Code, Executor, allocate, append, free, register
from tests.support.durability import (MIXED_WORKLOAD, NAMESPACE, POOL_RESET, REMOVED, STORED,
                                      cached_blocks, journal, kill_9, observed_state, redis_events,
                                      register_pools, replay, rpc_events, run_workload,
                                      snapshot_seq, stubs)
from tests.support.polling import wait_timed

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which(REDIS_SERVER) is None,
                       reason="redis-server is not installed"),
]


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
    wait_timed(lambda: len(received) == 2, 5, "2 followed events")
    call.cancel()
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert failures == [Code.CANCELLED]
    assert received == rpc_events(admin, last + 1)
    assert [(e.seq, e.type) for e in received] == [(last + 1, STORED), (last + 2, STORED)]


def test_events_stream_that_lost_its_tail_is_resynced_on_start(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    run_workload(register_pools(stub), MIXED_WORKLOAD)
    events = rpc_events(admin)
    before = observed_state(admin)
    kill_9(durable)
    client = redis_server.client()
    # Redis lost the newest entry, the events of the last command (an older append-only file,
    # say); the journal is whole.
    ((last_entry, fields),) = client.xrevrange(f"{NAMESPACE}:events", count=1)
    lost = int(fields[b"count"])
    assert client.xdel(f"{NAMESPACE}:events", last_entry) == 1

    recovered = durable_allocator(redis_server.url)
    _, admin = stubs(recovered)
    assert observed_state(admin) == before
    assert (f"lost data (event stream ends at {events[-1 - lost].seq}, state at "
            f"{events[-1].seq})" in recovered.stderr_tail())
    stored = redis_events(client)
    assert stored[:len(events) - lost] == events[:-lost]
    resynced = stored[len(events) - lost:]
    assert [e.seq for e in resynced] == list(range(events[-1].seq + 1,
                                                   events[-1].seq + 1 + len(resynced)))
    assert [(e.executor_id, e.reason) for e in resynced if e.type == POOL_RESET] == [
        ("gpu-a", "resync"), ("gpu-b", "resync")]
    assert replay(stored) == cached_blocks(admin)
    assert rpc_events(admin) == stored
    # The resync came with a fresh snapshot of the loaded state.
    assert snapshot_seq(client) == 2 + len(MIXED_WORKLOAD)
    assert journal(client) == []



def test_a_commands_events_are_one_entry_and_the_stream_keeps_the_newest_events_max(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    durable = durable_allocator(redis_server.url, "--events-max", "60")
    stub, admin = stubs(durable)
    executor = register(stub, "ev-cap", num_blocks=64, block_size=2)
    # Each Step stores 4 blocks of a fresh prompt and frees it: one entry of 4 events.
    for n in range(200):
        prompt = list(range(1000 * n, 1000 * n + 8))
        executor.step(allocate(f"s{n}", prompt), append(f"s{n}", num_computed_tokens=8),
                      free(f"s{n}"))
    client = redis_server.client()
    entries = client.xrange(f"{NAMESPACE}:events")
    assert all(int(fields[b"count"]) >= 4 for _, fields in entries[1:])
    kept = redis_events(client)
    last = kept[-1].seq
    assert [e.seq for e in kept] == list(range(kept[0].seq, last + 1))
    # Trimmed (Redis trims whole nodes of 100 entries), and never below the newest 60 events.
    assert kept[0].seq > 1 and last - kept[0].seq + 1 >= 60
    # StreamEvents from anywhere inside an entry starts at that event; from before the oldest
    # kept one, at the oldest.
    middle = kept[len(kept) // 2 + 1].seq
    assert [e.seq for e in rpc_events(admin, middle)] == list(range(middle, last + 1))
    assert rpc_events(admin, 1) == kept
