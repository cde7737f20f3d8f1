"""The allocator's block protocol over the wire, against the real server in a subprocess: no mocks.

Health and reflection, Steps and the admin views of their effect, idempotent steps, leases and
epochs. Most tests share one server (session scope, see tests/conftest.py) and each registers
executors of its own, named after the test; only lease expiry gets a dedicated server. Block ids
are exact: a new pool's free list is 0, 1, 2, ... and blocks that hold nothing reusable go back
to its head.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import (ADMIN, REFLECTION, REFLECTION_V1, Code, Executor,
                                          allocate, append, assert_health_and_reflection_answer,
                                          fork, free, pool_stats, reflection_info, register,
                                          rpc_error, seq_ids)

pytestmark = pytest.mark.timeout(60)


# -- health and reflection ------------------------------------------------------------------------

def test_health_reports_serving_and_reflection_lists_the_services(
        server: AllocatorProcess) -> None:
    assert_health_and_reflection_answer(server.channel())


@pytest.mark.parametrize("version", [REFLECTION, REFLECTION_V1])
def test_reflection_serves_the_allocator_proto_file(server: AllocatorProcess, version) -> None:
    responses = reflection_info(server.channel(), version)(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=ADMIN),
              reflection_pb2.ServerReflectionRequest(file_containing_symbol=REFLECTION_V1)]),
        timeout=5)
    admin_file, reflection_file = [
        [descriptor_pb2.FileDescriptorProto.FromString(raw)
         for raw in response.file_descriptor_response.file_descriptor_proto]
        for response in responses]
    (allocator_file,) = [f for f in admin_file if f.package == "pagedserve.allocator.v1"]
    assert allocator_file.name == "pagedserve/allocator/v1/allocator.proto"
    assert [s.name for s in allocator_file.service] == ["Allocator", "AllocatorAdmin"]
    # grpcurl describes the reflection service it speaks, v1 included.
    (v1_file,) = reflection_file
    assert (v1_file.package, v1_file.service[0].name) == ("grpc.reflection.v1",
                                                          "ServerReflection")


# -- the block protocol over the wire -------------------------------------------------------------

def test_allocate_append_fork_then_append_copies_the_shared_tail_block(
        stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor]) -> None:
    ex = new_executor(num_blocks=8, block_size=4)

    # 10 prompt tokens → 3 blocks: [1 2 3 4][5 6 7 8][9 10 . .]
    first = ex.step(allocate("a", list(range(1, 11))))
    assert list(first.results) == [pb.OpResult(block_table=[0, 1, 2])]
    assert (first.replayed, first.num_free_blocks) == (False, 5)

    # One sampled token fits the third block; the prompt is computed, so blocks 0, 1 get cached.
    second = ex.step(append("a", [11], num_computed_tokens=10))
    assert list(second.results) == [pb.OpResult()]
    assert second.num_free_blocks == 5

    third = ex.step(fork("a", "b"))
    assert list(third.results) == [pb.OpResult(block_table=[0, 1, 2])]
    assert third.num_free_blocks == 5

    # b writes into shared block 2 first: it gets block 3 and a copy 2 → 3. Then a owns block 2
    # alone, writes into it without a copy and grows into block 4.
    fourth = ex.step(append("b", [99]), append("a", [12, 13]))
    assert list(fourth.results) == [
        pb.OpResult(copies=[pb.BlockCopy(src_block=2, dst_block=3)]),
        pb.OpResult(new_blocks=[4]),
    ]
    assert fourth.num_free_blocks == 3

    table_a = admin.GetBlockTable(pb.GetBlockTableRequest(executor_id=ex.executor_id,
                                                          seq_id="a"), timeout=5)
    table_b = admin.GetBlockTable(pb.GetBlockTableRequest(executor_id=ex.executor_id,
                                                          seq_id="b"), timeout=5)
    assert (list(table_a.block_ids), table_a.num_tokens, table_a.block_size) == (
        [0, 1, 2, 4], 13, 4)
    assert (list(table_b.block_ids), table_b.num_tokens, table_b.block_size) == (
        [0, 1, 3], 12, 4)

    dump = admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=ex.executor_id), timeout=5)
    assert [b.ref_count for b in dump.blocks] == [2, 2, 1, 1, 1, 0, 0, 0]
    assert list(dump.free_list) == [5, 6, 7]
    sequences = admin.ListSequences(pb.ListSequencesRequest(executor_id=ex.executor_id),
                                    timeout=5).sequences
    assert [(s.seq_id, s.num_tokens, s.num_blocks, s.num_cached_tokens, s.num_computed_tokens)
            for s in sequences] == [("a", 13, 4, 0, 10), ("b", 12, 3, 0, 10)]


def test_match_prefix_reports_cached_tokens_per_executor_and_salt(
        stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor]) -> None:
    ex = new_executor(num_blocks=8, block_size=4)
    prompt = list(range(1, 11))
    ex.step(allocate("p", prompt, cache_salt="tenant-a"))
    ex.step(append("p", num_computed_tokens=10))  # blocks 0 and 1 become cache entries
    ex.heartbeat(num_waiting=3, num_running=2)

    def match(token_ids: list[int], cache_salt: str) -> pb.ExecutorMatch:
        response = stub.MatchPrefix(pb.MatchPrefixRequest(token_ids=token_ids,
                                                          cache_salt=cache_salt), timeout=5)
        (mine,) = [m for m in response.executors if m.executor_id == ex.executor_id]
        return mine

    shares_prefix = prompt[:8] + [50, 51, 52]
    assert match(shares_prefix, "tenant-a") == pb.ExecutorMatch(
        executor_id=ex.executor_id, address="127.0.0.1:50053", num_cached_tokens=8,
        num_free_blocks=5, num_blocks=8, num_waiting=3, num_running=2, num_sequences=1)
    assert match(shares_prefix, "tenant-b").num_cached_tokens == 0
    # The block holding a prompt's last token is always computed, never served from cache.
    assert match(prompt[:8], "tenant-a").num_cached_tokens == 4
    assert match([7, 7, 7, 7, 7], "tenant-a").num_cached_tokens == 0

    hit = ex.step(allocate("q", shares_prefix, cache_salt="tenant-a"))
    assert list(hit.results) == [pb.OpResult(block_table=[0, 1, 3], num_cached_tokens=8)]
    stats = pool_stats(admin, ex.executor_id)
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (21, 8)
    assert stats.prefix_hit_rate == pytest.approx(8 / 21)
    assert [(b.ref_count, b.num_blocks) for b in stats.refcount_histogram] == [(1, 2), (2, 2)]


# -- idempotent steps -----------------------------------------------------------------------------

def test_resent_step_is_replayed_with_identical_results_and_applies_nothing(
        stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor]) -> None:
    ex = new_executor(num_blocks=8, block_size=4)
    step_one = ex.request(1, allocate("s", [1, 2, 3, 4, 5]))
    first = stub.Step(step_one, timeout=5)
    assert list(first.results) == [pb.OpResult(block_table=[0, 1])]
    assert (first.replayed, first.num_free_blocks) == (False, 6)

    again = stub.Step(step_one, timeout=5)
    assert again.replayed is True
    assert (list(again.results), again.num_free_blocks) == (list(first.results), 6)
    assert seq_ids(admin, ex.executor_id) == ["s"]
    stats = pool_stats(admin, ex.executor_id)
    assert (stats.num_used_blocks, stats.num_free_blocks, stats.num_sequences) == (2, 6, 1)

    second = stub.Step(ex.request(2, append("s", [6, 7, 8, 9])), timeout=5)
    assert list(second.results) == [pb.OpResult(new_blocks=[2])]
    # An older step still replays its recorded response, not the pool as it is now.
    late = stub.Step(step_one, timeout=5)
    assert (late.replayed, list(late.results), late.num_free_blocks) == (
        True, list(first.results), 6)
    (info,) = [e for e in admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors
               if e.executor_id == ex.executor_id]
    assert info.last_step_id == 2
    table = admin.GetBlockTable(pb.GetBlockTableRequest(executor_id=ex.executor_id, seq_id="s"),
                                timeout=5)
    assert (list(table.block_ids), table.num_tokens) == ([0, 1, 2], 9)


def test_step_id_reused_with_different_ops_is_failed_precondition(
        stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor]) -> None:
    ex = new_executor()
    stub.Step(ex.request(1, allocate("s", [1, 2, 3])), timeout=5)
    error = rpc_error(lambda: stub.Step(ex.request(1, allocate("t", [1, 2, 3])), timeout=5))
    assert error.code() == Code.FAILED_PRECONDITION
    assert (f"step_id 1 of executor {ex.executor_id!r} was already applied with different ops"
            in error.details())
    assert seq_ids(admin, ex.executor_id) == ["s"]


def test_step_id_zero_is_invalid_argument(stub: pb_grpc.AllocatorStub,
                                          admin: pb_grpc.AllocatorAdminStub,
                                          new_executor: Callable[..., Executor]) -> None:
    ex = new_executor()
    error = rpc_error(lambda: stub.Step(ex.request(0, allocate("s", [1])), timeout=5))
    assert error.code() == Code.INVALID_ARGUMENT
    assert "step_id must be at least 1, got 0" in error.details()
    assert seq_ids(admin, ex.executor_id) == []


def test_step_older_than_the_kept_step_log_is_failed_precondition(
        stub: pb_grpc.AllocatorStub, new_executor: Callable[..., Executor]) -> None:
    ex = new_executor()
    for _ in range(65):  # the server keeps the last 64 steps (--step-log-size default)
        ex.step()
    assert stub.Step(ex.request(2), timeout=5).replayed is True
    error = rpc_error(lambda: stub.Step(ex.request(1), timeout=5))
    assert error.code() == Code.FAILED_PRECONDITION
    assert (f"step_id 1 of executor {ex.executor_id!r} is not above the last applied step id 65"
            in error.details())
    assert "older than the 64 kept" in error.details()


def test_refused_step_applies_no_op_and_leaves_its_step_id_unused(
        stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor]) -> None:
    ex = new_executor()
    bad = ex.request(1, allocate("ok", [1, 2]), allocate("bad", [1, -2]))
    assert rpc_error(lambda: stub.Step(bad, timeout=5)).code() == Code.INVALID_ARGUMENT
    assert seq_ids(admin, ex.executor_id) == []

    fixed = stub.Step(ex.request(1, allocate("ok", [1, 2]), allocate("bad", [1, 2])), timeout=5)
    assert fixed.replayed is False
    assert list(fixed.results) == [pb.OpResult(block_table=[0]), pb.OpResult(block_table=[1])]


# -- leases and epochs ----------------------------------------------------------------------------

def test_lease_lapses_without_heartbeat_and_its_pool_is_reclaimed(
        start_allocator: Callable[..., AllocatorProcess]) -> None:
    # Seconds, not less: a loaded machine (`pytest -n 2`) may pause the test for a good part
    # of a shorter lease, and lapse a pool the test keeps alive.
    process = start_allocator("--lease-ttl", "2")
    stub = pb_grpc.AllocatorStub(process.channel())
    admin = pb_grpc.AllocatorAdminStub(process.channel())
    registered = stub.RegisterExecutor(pb.RegisterExecutorRequest(
        executor_id="silent", num_blocks=8, block_size=4), timeout=5)
    assert registered.lease_ttl_s == 2.0
    silent = Executor(stub, "silent", registered.epoch)
    heartbeating = register(stub, "heartbeating")
    stepping = register(stub, "stepping")
    silent.step(allocate("s", [1, 2, 3]))

    def live_ids() -> list[str]:
        return [e.executor_id for e in
                admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors]

    deadline = time.monotonic() + 15.0
    while "silent" in live_ids() and time.monotonic() < deadline:
        heartbeating.heartbeat()
        stepping.step()  # a Step renews the lease as well
        time.sleep(0.05)
    assert live_ids() == ["heartbeating", "stepping"]

    error = rpc_error(lambda: silent.step(free("s")))
    assert error.code() == Code.NOT_FOUND
    assert "executor 'silent' is not registered" in error.details()
    assert rpc_error(silent.heartbeat).code() == Code.NOT_FOUND
    assert heartbeating.heartbeat().lease_ttl_s == 2.0
    assert "lease of executor 'silent' lapsed" in process.stderr_tail()


def test_registering_again_gives_a_higher_epoch_and_an_empty_pool(
        stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        request: pytest.FixtureRequest) -> None:
    executor_id = request.node.name
    old = register(stub, executor_id, num_blocks=8, block_size=4)
    old.step(allocate("s", [1, 2, 3, 4, 5]))

    new = register(stub, executor_id, num_blocks=6, block_size=2)
    assert new.epoch > old.epoch
    assert seq_ids(admin, executor_id) == []
    stats = pool_stats(admin, executor_id)
    assert (stats.num_blocks, stats.block_size, stats.num_free_blocks, stats.num_used_blocks) == (
        6, 2, 6, 0)

    for call in (lambda: old.step(free("s")), old.heartbeat):
        error = rpc_error(call)
        assert error.code() == Code.FAILED_PRECONDITION
        assert (f"sent epoch {old.epoch} but its pool is at epoch {new.epoch}"
                in error.details())

    # Step ids start again with the new epoch.
    fresh = new.step(allocate("s", [1, 2, 3]))
    assert (fresh.replayed, list(fresh.results)) == (False, [pb.OpResult(block_table=[0, 1])])
