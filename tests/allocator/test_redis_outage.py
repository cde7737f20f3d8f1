"""Redis away under a durable allocator: changes are refused with UNAVAILABLE, health turns
NOT_SERVING, reads keep answering, and when Redis is back (with or without its data) the
allocator reconciles by itself without memory and Redis ever diverging. Also: starting before
Redis exists, and a second allocator writing to the same keys. Real processes only."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.client import open_channel
from pagedserve.supervisor.redis_server import REDIS_SERVER, RedisProcess, free_port
from pagedserve.supervisor.service_process import (READY_PREFIX, REPO_ROOT, AllocatorProcess,
                                                   hermetic_env)
from tests.support.allocator_wire import (ADMIN, ALLOCATOR, Code, Executor, allocate, append, fork,
                                          free, health_status, register, rpc_error)
from tests.support.durability import (CONTINUATION, MIXED_WORKLOAD, NOT_SERVING, OK, POOL_RESET,
                                      STORED, applied_seq, assert_audit_clean, cached_blocks,
                                      journal, kill_9, not_serving, observed_state, outcomes,
                                      redis_events, register_pools, replay, rpc_events,
                                      run_workload, serving, snapshot_seq, stubs)
from tests.support.polling import wait_timed

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which(REDIS_SERVER) is None,
                       reason="redis-server is not installed"),
]


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
    wait_timed(not_serving(channel), 2, "health NOT_SERVING")
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
    wait_timed(serving(channel), 5, "health SERVING after Redis came back")
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
    wait_timed(not_serving(durable.channel()), 2, "health NOT_SERVING")
    details.append(rpc_error(lambda: executor.step(allocate("b", [1]))).details())
    assert all(hidden in text and password not in text for text in details), details
    durable.stop()
    assert hidden in durable.stderr_tail(500)
    assert password not in durable.stderr_tail(500)



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
        wait_timed(not_serving(channel), 2, "health NOT_SERVING")
        volatile.restart()  # no append-only file: it comes back empty
        wait_timed(serving(channel), 5, "health SERVING after the reseed")

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
        wait_timed(serving(channel), 5, "health SERVING once Redis is up")
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

