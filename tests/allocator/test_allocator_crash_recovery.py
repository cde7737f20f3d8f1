"""A durable allocator (`--state-url`) killed with SIGKILL and started again on the same Redis
continues exactly where it stopped: pools, block tables, free-list (LRU) order, reference counts,
hash index, epochs, counters, recorded step results and events all compare equal, and a workload
continued afterwards answers like an in-memory allocator that never crashed. Real processes only.
"""
from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest

from allocator_service.durability import snapshot
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.supervisor.redis_server import REDIS_SERVER, RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import Code, Executor, allocate, append, free, register, rpc_error
from tests.support.durability import (CONTINUATION, MIXED_WORKLOAD, MIXED_WORKLOAD_OUTCOMES,
                                      NAMESPACE, OK, POOL_RESET, STORED, applied_seq,
                                      assert_audit_clean, journal, kill_9, observed_state, outcomes,
                                      reattach, register_pools, retry_all, rpc_events, run_workload,
                                      settled_snapshot_seq, snapshot_seq, stubs)
from tests.support.polling import wait_timed

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which(REDIS_SERVER) is None,
                       reason="redis-server is not installed"),
]


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
    assert client.hget(f"{NAMESPACE}:meta", "format") == str(snapshot.FORMAT_VERSION).encode()
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



def test_lease_expiry_is_journaled_and_survives_a_restart(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    # Long enough that the Step after the registration renews the lease even on a loaded
    # machine (0.5 s once lapsed in between under `pytest -n 2`).
    durable = durable_allocator(redis_server.url, "--lease-ttl", "2")
    stub, admin = stubs(durable)
    executor = register(stub, "lapsing", num_blocks=8, block_size=4)
    executor.step(allocate("a", list(range(8))), append("a", num_computed_tokens=8))
    wait_timed(lambda: not admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors,
               10, "the lease to lapse")
    assert journal(redis_server.client()) == [(1, "register"), (2, "step"), (3, "reclaim")]

    kill_9(durable)
    recovered = durable_allocator(redis_server.url, "--lease-ttl", "2")
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

