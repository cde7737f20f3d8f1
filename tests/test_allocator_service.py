"""The allocator's gRPC surface against the real server in a subprocess: no mocks.

Most tests share one server (module scope) and each registers executors of its own, named after
the test; only auth, lease expiry and shutdown get dedicated servers. Block ids are exact: a new
pool's free list is 0, 1, 2, ... and blocks that hold nothing reusable go back to its head.
"""
from __future__ import annotations

import base64
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from PIL import Image

from allocator_process import REPO_ROOT, AllocatorProcess, AllocatorStartError, hermetic_env
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

TOKEN = "integration-test-token"
ALLOCATOR = "pagedserve.allocator.v1.Allocator"
ADMIN = "pagedserve.allocator.v1.AllocatorAdmin"
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
Code = grpc.StatusCode


# -- servers and stubs -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def server() -> Iterator[AllocatorProcess]:
    """Shared by every test that registers executors of its own; leases outlast the module."""
    with AllocatorProcess("--lease-ttl", "600") as process:
        yield process


@pytest.fixture(scope="module")
def stub(server: AllocatorProcess) -> pb_grpc.AllocatorStub:
    return pb_grpc.AllocatorStub(server.channel())


@pytest.fixture(scope="module")
def admin(server: AllocatorProcess) -> pb_grpc.AllocatorAdminStub:
    return pb_grpc.AllocatorAdminStub(server.channel())


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AllocatorProcess]:
    with AllocatorProcess("--auth-token", TOKEN) as process:
        yield process


# -- an executor's side of the protocol ----------------------------------------------------

@dataclass
class Executor:
    """A registered executor: sends Steps with increasing step ids at its epoch."""
    stub: pb_grpc.AllocatorStub
    executor_id: str
    epoch: int
    step_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def step(self, *ops: pb.BlockOp) -> pb.StepResponse:
        return self.stub.Step(self.request(next(self.step_ids), *ops), timeout=5)

    def request(self, step_id: int, *ops: pb.BlockOp) -> pb.StepRequest:
        return pb.StepRequest(executor_id=self.executor_id, epoch=self.epoch, step_id=step_id,
                              ops=ops)

    def heartbeat(self, num_waiting: int = 0, num_running: int = 0) -> pb.HeartbeatResponse:
        return self.stub.Heartbeat(pb.HeartbeatRequest(
            executor_id=self.executor_id, epoch=self.epoch, num_waiting=num_waiting,
            num_running=num_running), timeout=5)


def register(stub: pb_grpc.AllocatorStub, executor_id: str, num_blocks: int = 8,
             block_size: int = 4, address: str = "127.0.0.1:50053",
             model_fingerprint: str = "test-model") -> Executor:
    response = stub.RegisterExecutor(pb.RegisterExecutorRequest(
        executor_id=executor_id, address=address, num_blocks=num_blocks, block_size=block_size,
        model_fingerprint=model_fingerprint), timeout=5)
    return Executor(stub, executor_id, response.epoch)


@pytest.fixture
def new_executor(stub: pb_grpc.AllocatorStub,
                 request: pytest.FixtureRequest) -> Callable[..., Executor]:
    """Registers executors named after the test, so tests sharing a server never collide."""
    names = (f"{request.node.name}-{n}" for n in itertools.count())

    def make(num_blocks: int = 8, block_size: int = 4) -> Executor:
        return register(stub, next(names), num_blocks, block_size)

    return make


def allocate(seq_id: str, token_ids: Sequence[int], cache_salt: str = "",
             lookahead_slots: int = 0) -> pb.BlockOp:
    return pb.BlockOp(allocate=pb.AllocateOp(seq_id=seq_id, token_ids=token_ids,
                                             cache_salt=cache_salt,
                                             lookahead_slots=lookahead_slots))


def append(seq_id: str, token_ids: Sequence[int] = (), num_computed_tokens: int = 0,
           lookahead_slots: int = 0) -> pb.BlockOp:
    return pb.BlockOp(append=pb.AppendOp(seq_id=seq_id, token_ids=token_ids,
                                         num_computed_tokens=num_computed_tokens,
                                         lookahead_slots=lookahead_slots))


def fork(parent_seq_id: str, child_seq_id: str) -> pb.BlockOp:
    return pb.BlockOp(fork=pb.ForkOp(parent_seq_id=parent_seq_id, child_seq_id=child_seq_id))


def free(seq_id: str) -> pb.BlockOp:
    return pb.BlockOp(free=pb.FreeOp(seq_id=seq_id))


# -- assertions ------------------------------------------------------------------------------

def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def health_status(channel: grpc.Channel, service: str) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5).status


def reflection_services(channel: grpc.Channel) -> set[str]:
    responses = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    (response,) = list(responses)
    return {service.name for service in response.list_services_response.service}


def assert_health_and_reflection_answer(channel: grpc.Channel) -> None:
    for service in ("", ALLOCATOR, ADMIN):
        assert health_status(channel, service) == health_pb2.HealthCheckResponse.SERVING, service
    assert reflection_services(channel) == {ALLOCATOR, ADMIN, HEALTH, REFLECTION}


def assert_still_serving(server: AllocatorProcess, stub: pb_grpc.AllocatorStub,
                         admin: pb_grpc.AllocatorAdminStub) -> None:
    """Health SERVING, a valid call answers, and every pool passes the audit."""
    assert server.process.poll() is None, server.stderr_tail()
    assert health_status(server.channel(), "") == health_pb2.HealthCheckResponse.SERVING
    stub.MatchPrefix(pb.MatchPrefixRequest(token_ids=[1, 2, 3]), timeout=5)
    assert list(admin.Audit(pb.AuditRequest(), timeout=5).violations) == []


def pool_snapshot(admin: pb_grpc.AllocatorAdminStub, executor_id: str) -> tuple[object, ...]:
    """Everything a failed request must leave unchanged about one pool and the registry."""
    executors = admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors
    return ([(e.executor_id, e.epoch, e.num_blocks, e.last_step_id) for e in executors],
            admin.ListSequences(pb.ListSequencesRequest(), timeout=5),
            admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=executor_id), timeout=5))


def seq_ids(admin: pb_grpc.AllocatorAdminStub, executor_id: str) -> list[str]:
    return [s.seq_id for s in admin.ListSequences(
        pb.ListSequencesRequest(executor_id=executor_id), timeout=5).sequences]


def pool_stats(admin: pb_grpc.AllocatorAdminStub, executor_id: str) -> pb.PoolStats:
    (stats,) = admin.GetStats(pb.GetStatsRequest(executor_id=executor_id), timeout=5).pools
    return stats


# -- health and reflection ---------------------------------------------------------------------

def test_health_reports_serving_and_reflection_lists_the_services(
        server: AllocatorProcess) -> None:
    assert_health_and_reflection_answer(server.channel())


def test_reflection_serves_the_allocator_proto_file(server: AllocatorProcess) -> None:
    responses = reflection_pb2_grpc.ServerReflectionStub(server.channel()).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=ADMIN)]), timeout=5)
    (response,) = list(responses)
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in response.file_descriptor_response.file_descriptor_proto]
    (allocator_file,) = [f for f in files if f.package == "pagedserve.allocator.v1"]
    assert allocator_file.name == "pagedserve/allocator/v1/allocator.proto"
    assert [s.name for s in allocator_file.service] == ["Allocator", "AllocatorAdmin"]


# -- the block protocol over the wire ---------------------------------------------------------

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


# -- idempotent steps ---------------------------------------------------------------------------

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
    process = start_allocator("--lease-ttl", "0.5")
    stub = pb_grpc.AllocatorStub(process.channel())
    admin = pb_grpc.AllocatorAdminStub(process.channel())
    registered = stub.RegisterExecutor(pb.RegisterExecutorRequest(
        executor_id="silent", num_blocks=8, block_size=4), timeout=5)
    assert registered.lease_ttl_s == 0.5
    silent = Executor(stub, "silent", registered.epoch)
    heartbeating = register(stub, "heartbeating")
    stepping = register(stub, "stepping")
    silent.step(allocate("s", [1, 2, 3]))

    def live_ids() -> list[str]:
        return [e.executor_id for e in
                admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors]

    deadline = time.monotonic() + 5.0
    while "silent" in live_ids() and time.monotonic() < deadline:
        heartbeating.heartbeat()
        stepping.step()  # a Step renews the lease as well
        time.sleep(0.05)
    assert live_ids() == ["heartbeating", "stepping"]

    error = rpc_error(lambda: silent.step(free("s")))
    assert error.code() == Code.NOT_FOUND
    assert "executor 'silent' is not registered" in error.details()
    assert rpc_error(silent.heartbeat).code() == Code.NOT_FOUND
    assert heartbeating.heartbeat().lease_ttl_s == 0.5
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


# -- auth -----------------------------------------------------------------------------------------

EVERY_RPC = [pytest.param(service, method, request, id=method) for service, method, request in [
    ("Allocator", "RegisterExecutor", pb.RegisterExecutorRequest()),
    ("Allocator", "Heartbeat", pb.HeartbeatRequest()),
    ("Allocator", "Step", pb.StepRequest()),
    ("Allocator", "MatchPrefix", pb.MatchPrefixRequest()),
    ("AllocatorAdmin", "GetStats", pb.GetStatsRequest()),
    ("AllocatorAdmin", "ListExecutors", pb.ListExecutorsRequest()),
    ("AllocatorAdmin", "ListSequences", pb.ListSequencesRequest()),
    ("AllocatorAdmin", "GetBlockTable", pb.GetBlockTableRequest()),
    ("AllocatorAdmin", "DumpBlocks", pb.DumpBlocksRequest()),
    ("AllocatorAdmin", "Audit", pb.AuditRequest()),
    ("AllocatorAdmin", "ResetPrefixCache", pb.ResetPrefixCacheRequest()),
]]


def test_every_rpc_is_listed_for_the_auth_check() -> None:
    methods = {(service, method) for service in ("Allocator", "AllocatorAdmin")
               for method in pb.DESCRIPTOR.services_by_name[service].methods_by_name}
    assert {(p.values[0], p.values[1]) for p in EVERY_RPC} == methods


@pytest.mark.parametrize("token, reason", [
    pytest.param("", "missing 'authorization: Bearer <token>' metadata", id="no-token"),
    pytest.param("not-the-token", "wrong bearer token", id="wrong-token"),
])
@pytest.mark.parametrize("service, method, request_message", EVERY_RPC)
def test_rpc_without_the_right_token_is_unauthenticated(
        auth_server: AllocatorProcess, service: str, method: str,
        request_message: object, token: str, reason: str) -> None:
    stub_class = pb_grpc.AllocatorStub if service == "Allocator" else pb_grpc.AllocatorAdminStub
    call = getattr(stub_class(auth_server.channel(token)), method)
    error = rpc_error(lambda: call(request_message, timeout=5))
    assert error.code() == Code.UNAUTHENTICATED
    assert error.details() == f"{reason}; pass the service's --auth-token (PAGEDSERVE_AUTH_TOKEN)"


def test_health_and_reflection_need_no_token(auth_server: AllocatorProcess) -> None:
    assert_health_and_reflection_answer(auth_server.channel())


def test_every_rpc_succeeds_with_the_right_token(auth_server: AllocatorProcess) -> None:
    channel = auth_server.channel(TOKEN)
    stub, admin = pb_grpc.AllocatorStub(channel), pb_grpc.AllocatorAdminStub(channel)
    ex = register(stub, "authorized", num_blocks=4, block_size=2)
    ex.heartbeat(num_waiting=1)
    assert list(ex.step(allocate("s", [1, 2, 3])).results) == [pb.OpResult(block_table=[0, 1])]
    (match,) = stub.MatchPrefix(pb.MatchPrefixRequest(token_ids=[1, 2, 3]), timeout=5).executors
    assert (match.executor_id, match.num_waiting, match.num_sequences) == ("authorized", 1, 1)
    assert admin.GetStats(pb.GetStatsRequest(), timeout=5).total.num_used_blocks == 2
    assert [e.executor_id for e in admin.ListExecutors(pb.ListExecutorsRequest(),
                                                        timeout=5).executors] == ["authorized"]
    assert seq_ids(admin, "authorized") == ["s"]
    assert list(admin.GetBlockTable(pb.GetBlockTableRequest(seq_id="s"),
                                    timeout=5).block_ids) == [0, 1]
    assert len(admin.DumpBlocks(pb.DumpBlocksRequest(executor_id="authorized"),
                                timeout=5).blocks) == 4
    assert list(admin.Audit(pb.AuditRequest(), timeout=5).violations) == []
    assert admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(),
                                  timeout=5).num_entries_dropped == 0


# -- bad input ------------------------------------------------------------------------------------

def _registration(num_blocks: int = 8, block_size: int = 4,
                  executor_id: str = "refused") -> Callable[..., object]:
    return lambda stub, admin, ex: stub.RegisterExecutor(pb.RegisterExecutorRequest(
        executor_id=executor_id, num_blocks=num_blocks, block_size=block_size), timeout=5)


def _step(*ops: pb.BlockOp, executor_id: str = "", epoch_offset: int = 0) -> Callable[..., object]:
    """A Step whose op 0 is valid and the rest are the ones under test."""
    return lambda stub, admin, ex: stub.Step(pb.StepRequest(
        executor_id=executor_id or ex.executor_id, epoch=ex.epoch + epoch_offset, step_id=1,
        ops=[allocate("valid", [1, 2, 3]), *ops]), timeout=5)


REQUEST_ERRORS = [
    pytest.param(_registration(num_blocks=0), Code.INVALID_ARGUMENT,
                 "num_blocks must be between 1 and 1048576, got 0", id="num_blocks-zero"),
    pytest.param(_registration(num_blocks=-1), Code.INVALID_ARGUMENT,
                 "num_blocks must be between 1 and 1048576, got -1", id="num_blocks-negative"),
    pytest.param(_registration(num_blocks=2**40), Code.INVALID_ARGUMENT,
                 "num_blocks must be between 1 and 1048576, got 1099511627776",
                 id="num_blocks-2**40"),
    pytest.param(_registration(block_size=0), Code.INVALID_ARGUMENT,
                 "block_size must be between 1 and 4096, got 0", id="block_size-zero"),
    pytest.param(_registration(executor_id=""), Code.INVALID_ARGUMENT, "executor_id is empty",
                 id="executor_id-empty"),
    pytest.param(_step(executor_id="nobody"), Code.NOT_FOUND,
                 "executor 'nobody' is not registered", id="step-unknown-executor"),
    pytest.param(_step(epoch_offset=1000), Code.FAILED_PRECONDITION,
                 "but its pool is at epoch", id="step-wrong-epoch"),
    pytest.param(_step(*[free("x")] * 65536), Code.INVALID_ARGUMENT,
                 "a step carries at most 65536 ops, got 65537", id="step-too-many-ops"),
    pytest.param(_step(pb.BlockOp()), Code.INVALID_ARGUMENT,
                 "ops[1] sets no kind: set one of allocate, append, fork, free", id="op-no-kind"),
    pytest.param(_step(allocate("empty", [])), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): token_ids is empty", id="allocate-no-tokens"),
    pytest.param(_step(allocate("negative", [5, -7])), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): token ids must not be negative, got -7",
                 id="allocate-negative-token"),
    pytest.param(_step(allocate("", [1])), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): seq_id is empty", id="allocate-empty-seq_id"),
    pytest.param(_step(allocate("ahead", [1], lookahead_slots=-1)), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): lookahead_slots must be between 0 and 65536, got -1",
                 id="allocate-negative-lookahead"),
    pytest.param(_step(fork("valid", "valid")), Code.INVALID_ARGUMENT,
                 "ops[1] (ForkOp): parent_seq_id and child_seq_id are the same",
                 id="fork-onto-itself"),
    pytest.param(_step(append("valid", num_computed_tokens=-1)), Code.INVALID_ARGUMENT,
                 "ops[1] (AppendOp): num_computed_tokens must not be negative, got -1",
                 id="append-negative-computed"),
    pytest.param(lambda stub, admin, ex: stub.Heartbeat(pb.HeartbeatRequest(
        executor_id=ex.executor_id, epoch=ex.epoch, num_waiting=-1), timeout=5),
        Code.INVALID_ARGUMENT, "num_waiting and num_running must not be negative",
        id="heartbeat-negative-num_waiting"),
    pytest.param(lambda stub, admin, ex: stub.MatchPrefix(pb.MatchPrefixRequest(), timeout=5),
                 Code.INVALID_ARGUMENT, "token_ids is empty", id="match_prefix-no-tokens"),
    pytest.param(lambda stub, admin, ex: stub.MatchPrefix(
        pb.MatchPrefixRequest(token_ids=[1, -1]), timeout=5),
        Code.INVALID_ARGUMENT, "token ids must not be negative", id="match_prefix-negative-token"),
    pytest.param(lambda stub, admin, ex: admin.GetBlockTable(pb.GetBlockTableRequest(
        executor_id=ex.executor_id, seq_id="ghost"), timeout=5),
        Code.NOT_FOUND, "no pool holds sequence 'ghost' on executor", id="block_table-unknown-seq"),
    pytest.param(lambda stub, admin, ex: admin.GetBlockTable(pb.GetBlockTableRequest(
        executor_id=ex.executor_id), timeout=5),
        Code.INVALID_ARGUMENT, "seq_id is empty", id="block_table-empty-seq_id"),
    pytest.param(lambda stub, admin, ex: admin.DumpBlocks(pb.DumpBlocksRequest(), timeout=5),
                 Code.INVALID_ARGUMENT, "executor_id is empty; DumpBlocks shows one pool",
                 id="dump_blocks-empty-executor_id"),
    pytest.param(lambda stub, admin, ex: admin.DumpBlocks(pb.DumpBlocksRequest(
        executor_id="nobody"), timeout=5),
        Code.NOT_FOUND, "executor 'nobody' is not registered", id="dump_blocks-unknown-executor"),
    pytest.param(lambda stub, admin, ex: admin.GetStats(pb.GetStatsRequest(
        executor_id="nobody"), timeout=5),
        Code.NOT_FOUND, "executor 'nobody' is not registered", id="stats-unknown-executor"),
]


@pytest.mark.parametrize("call, code, message", REQUEST_ERRORS)
def test_bad_request_gets_its_status_code_changes_nothing_and_server_keeps_serving(
        server: AllocatorProcess, stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor], call: Callable[..., object], code: grpc.StatusCode,
        message: str) -> None:
    ex = new_executor(num_blocks=4, block_size=4)
    before = pool_snapshot(admin, ex.executor_id)
    error = rpc_error(lambda: call(stub, admin, ex))
    assert error.code() == code, error.details()
    assert message in error.details()
    assert pool_snapshot(admin, ex.executor_id) == before
    assert_still_serving(server, stub, admin)


# Pool of 4 blocks of 4 slots; `setup` runs in a step of its own before the op under test.
OP_FAILURES = [
    pytest.param([], append("ghost", [1]), pb.OP_STATUS_NOT_FOUND,
                 "sequence 'ghost' is not allocated in this pool", id="append-unknown-seq"),
    pytest.param([], free("ghost"), pb.OP_STATUS_NOT_FOUND,
                 "sequence 'ghost' is not allocated in this pool", id="free-unknown-seq"),
    pytest.param([], fork("ghost", "child"), pb.OP_STATUS_NOT_FOUND,
                 "sequence 'ghost' is not allocated in this pool", id="fork-unknown-parent"),
    pytest.param([allocate("s", [1])], allocate("s", [2]), pb.OP_STATUS_ALREADY_EXISTS,
                 "sequence 's' already exists in this pool", id="allocate-existing-seq"),
    pytest.param([], allocate("huge", list(range(17))), pb.OP_STATUS_TOO_LARGE,
                 "17 tokens (+0 reserved) need 5 blocks of 4 slots but the pool has only 4",
                 id="prompt-larger-than-pool"),
    pytest.param([allocate("big", list(range(12)))], allocate("next", list(range(8))),
                 pb.OP_STATUS_OUT_OF_BLOCKS, "out of blocks: 1 of 4 free",
                 id="allocate-out-of-blocks"),
    pytest.param([allocate("big", list(range(12)))], append("big", list(range(5))),
                 pb.OP_STATUS_OUT_OF_BLOCKS, "out of blocks: 1 of 4 free",
                 id="append-out-of-blocks"),
]


@pytest.mark.parametrize("setup, op, status, message", OP_FAILURES)
def test_op_that_cannot_apply_reports_its_status_and_leaves_the_pool_unchanged(
        server: AllocatorProcess, stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor], setup: list[pb.BlockOp], op: pb.BlockOp,
        status: int, message: str) -> None:
    ex = new_executor(num_blocks=4, block_size=4)
    if setup:
        ex.step(*setup)
    before = pool_snapshot(admin, ex.executor_id)
    response = ex.step(op)
    (result,) = response.results
    assert result.status == status
    assert message in result.message
    assert result == pb.OpResult(status=status, message=result.message)  # nothing else granted
    assert response.num_free_blocks == pool_stats(admin, ex.executor_id).num_free_blocks
    assert pool_snapshot(admin, ex.executor_id)[1:] == before[1:]  # sequences and blocks
    assert_still_serving(server, stub, admin)


# -- pagedctl against the real server ------------------------------------------------------------

def pagedctl(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedserve.cli.pagedctl", "--target", target, *args],
        cwd=REPO_ROOT, env=hermetic_env({"PYTHONIOENCODING": "utf-8"}), capture_output=True,
        text=True, encoding="utf-8", timeout=60)


def table_row(output: str, first_cell: str) -> list[str]:
    """The cells of the table row starting with `first_cell` (cells hold no spaces here)."""
    (row,) = [line.split() for line in output.splitlines() if line.split()[:1] == [first_cell]]
    return row


def as_int(message: dict, key: str) -> int:
    """proto3 JSON: 64-bit ints are strings and zero values are left out."""
    return int(message.get(key, 0))


CTL = "pagedctl-pool"


@pytest.fixture(scope="class")
def ctl_pool(stub: pb_grpc.AllocatorStub) -> Executor:
    """8 blocks of 4: ctl-seq holds 0 1 2 (10 tokens); ctl-gone's cached blocks 3 4 were freed.

        blocks   0     1     2      3            4            5     6     7
        state    used  used  used   cached-free  cached-free  free  free  free
        free list (taken first → last): 5 6 7 4 3
    """
    ex = register(stub, CTL, num_blocks=8, block_size=4, address="10.0.0.7:50053",
                  model_fingerprint="llama-3-8b/fp16/bs4")
    ex.heartbeat(num_waiting=2, num_running=1)
    ex.step(allocate("ctl-seq", list(range(1, 11))), allocate("ctl-gone", list(range(101, 110))))
    ex.step(append("ctl-seq", num_computed_tokens=10), append("ctl-gone", num_computed_tokens=9))
    ex.step(free("ctl-gone"))
    return ex


@pytest.mark.usefixtures("ctl_pool")
class TestPagedctl:
    def test_stats_prints_the_pool_row_and_refcount_histogram(
            self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "stats", "--executor", CTL)
        assert done.returncode == 0, done.stderr
        expected = ["8", "3", "2", "3", "37.50", "0.00", "10", "12", "1"]
        assert table_row(done.stdout, CTL) == [CTL, *expected]
        assert table_row(done.stdout, "total") == ["total", *expected]
        assert done.stdout.splitlines()[-1] == "refcount histogram (refcount: blocks): 1: 3"

    def test_stats_json(self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "--json", "stats", "--executor", CTL)
        assert done.returncode == 0, done.stderr
        (pool,) = json.loads(done.stdout)["pools"]
        assert pool["executor_id"] == CTL
        assert {key: as_int(pool, key) for key in (
            "num_blocks", "num_used_blocks", "num_cached_free_blocks", "num_free_blocks",
            "tokens_stored", "slots_allocated", "num_sequences", "prefix_query_tokens",
            "prefix_hit_tokens", "block_size")} == {
            "num_blocks": 8, "num_used_blocks": 3, "num_cached_free_blocks": 2,
            "num_free_blocks": 3, "tokens_stored": 10, "slots_allocated": 12,
            "num_sequences": 1, "prefix_query_tokens": 19, "prefix_hit_tokens": 0,
            "block_size": 4}
        assert pool["usage_percent"] == 37.5

    def test_executors_prints_lease_load_and_last_step(self, server: AllocatorProcess,
                                                       ctl_pool: Executor) -> None:
        done = pagedctl(server.target, "executors")
        assert done.returncode == 0, done.stderr
        row = table_row(done.stdout, CTL)
        assert row[:5] + row[6:] == [CTL, "10.0.0.7:50053", str(ctl_pool.epoch), "8", "4",
                                     "2", "1", "3", "llama-3-8b/fp16/bs4"]
        assert 0 < float(row[5]) <= 600

        done = pagedctl(server.target, "--json", "executors")
        (info,) = [e for e in json.loads(done.stdout)["executors"] if e["executor_id"] == CTL]
        assert (info["address"], info["model_fingerprint"]) == ("10.0.0.7:50053",
                                                               "llama-3-8b/fp16/bs4")
        assert [as_int(info, key) for key in ("epoch", "num_blocks", "block_size", "num_waiting",
                                              "num_running", "last_step_id")] == [
            ctl_pool.epoch, 8, 4, 2, 1, 3]

    def test_sequences_lists_the_live_sequence(self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "sequences", "--executor", CTL)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["executor", "sequence", "tokens", "blocks", "cached",
                                    "computed"]
        assert [line.split() for line in lines[2:]] == [[CTL, "ctl-seq", "10", "3", "0", "10"]]

        done = pagedctl(server.target, "--json", "sequences", "--executor", CTL)
        (seq,) = json.loads(done.stdout)["sequences"]
        assert (seq["executor_id"], seq["seq_id"]) == (CTL, "ctl-seq")
        assert [as_int(seq, key) for key in ("num_tokens", "num_blocks", "num_cached_tokens",
                                             "num_computed_tokens")] == [10, 3, 0, 10]

    def test_table_prints_the_exact_block_ids(self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "table", "ctl-seq")
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"sequence ctl-seq on {CTL}: 10 tokens in 3 blocks of 4\n0 1 2\n"

        table = json.loads(pagedctl(server.target, "--json", "table", "ctl-seq").stdout)
        assert [int(b) for b in table["block_ids"]] == [0, 1, 2]
        assert (table["executor_id"], as_int(table, "num_tokens"), table["block_size"]) == (
            CTL, 10, 4)

    def test_table_of_unknown_sequence_exits_2_with_not_found(
            self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "table", "no-such-seq")
        assert done.returncode == 2
        assert done.stderr == "pagedctl: NOT_FOUND: no pool holds sequence 'no-such-seq'\n"

    def test_blocks_prints_every_block_and_the_free_list(self, server: AllocatorProcess,
                                                         admin: pb_grpc.AllocatorAdminStub) -> None:
        dump = admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=CTL), timeout=5)
        hashes = [b.block_hash.hex()[:16] for b in dump.blocks]
        assert [bool(h) for h in hashes] == [True, True, False, True, True, False, False, False]
        done = pagedctl(server.target, "blocks", CTL)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["block", "state", "refs", "tokens", "hash"]
        assert [line.split() for line in lines[2:10]] == [
            ["0", "used", "1", "4", hashes[0]],
            ["1", "used", "1", "4", hashes[1]],
            ["2", "used", "1", "2"],
            ["3", "cached-free", "0", "0", hashes[3]],
            ["4", "cached-free", "0", "0", hashes[4]],
            ["5", "free", "0", "0"],
            ["6", "free", "0", "0"],
            ["7", "free", "0", "0"],
        ]
        assert lines[10:] == ["free list (taken first → last): 5 6 7 4 3"]

        dumped = json.loads(pagedctl(server.target, "--json", "blocks", CTL).stdout)
        assert [as_int(b, "block_id") for b in dumped["blocks"]] == list(range(8))
        assert [b["state"] for b in dumped["blocks"]] == ["BLOCK_STATE_USED"] * 3 + [
            "BLOCK_STATE_CACHED_FREE"] * 2 + ["BLOCK_STATE_FREE"] * 3
        assert base64.b64decode(dumped["blocks"][0]["block_hash"]) == dump.blocks[0].block_hash
        assert [int(b) for b in dumped["free_list"]] == [5, 6, 7, 4, 3]

    def test_blocks_png_writes_a_readable_picture(self, server: AllocatorProcess,
                                                  tmp_path: Path) -> None:
        path = tmp_path / "pool.png"
        done = pagedctl(server.target, "blocks", CTL, "--png", str(path))
        assert done.returncode == 0, done.stderr
        assert f"wrote {path}" in done.stderr
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            image.load()
            assert image.format == "PNG"
            assert image.width > 0 and image.height > 0

    def test_audit_exits_0_and_reports_no_violations(self, server: AllocatorProcess,
                                                     admin: pb_grpc.AllocatorAdminStub) -> None:
        audit = admin.Audit(pb.AuditRequest(), timeout=5)
        assert list(audit.violations) == []
        done = pagedctl(server.target, "audit")
        assert done.returncode == 0, done.stderr
        assert done.stdout == (f"ok: {audit.num_pools} pools, {audit.num_blocks} blocks, "
                               "no violations\n")
        report = json.loads(pagedctl(server.target, "--json", "audit").stdout)
        assert (report.get("violations", []), report["num_pools"], as_int(report, "num_blocks")) \
            == ([], audit.num_pools, audit.num_blocks)

    def test_reset_prefix_cache_drops_the_pools_entries(self, server: AllocatorProcess,
                                                         stub: pb_grpc.AllocatorStub,
                                                         admin: pb_grpc.AllocatorAdminStub) -> None:
        ex = register(stub, "pagedctl-reset", num_blocks=4, block_size=4)
        prompt = list(range(1, 10))
        ex.step(allocate("r", prompt))
        ex.step(append("r", num_computed_tokens=9))  # blocks 0 and 1 cached
        done = pagedctl(server.target, "--json", "reset-prefix-cache", "--executor", ex.executor_id)
        assert done.returncode == 0, done.stderr
        assert as_int(json.loads(done.stdout), "num_entries_dropped") == 2
        done = pagedctl(server.target, "reset-prefix-cache", "--executor", ex.executor_id)
        assert done.stdout == "dropped 0 prefix-cache entries\n"
        (match,) = [m for m in stub.MatchPrefix(pb.MatchPrefixRequest(token_ids=prompt),
                                                timeout=5).executors
                    if m.executor_id == ex.executor_id]
        assert match.num_cached_tokens == 0
        assert pool_stats(admin, CTL).num_cached_free_blocks == 2  # other pools untouched


def test_pagedctl_json_keeps_fields_whose_value_is_zero(server: AllocatorProcess,
                                                       stub: pb_grpc.AllocatorStub) -> None:
    """`--json` is for scripts: block 0 must carry its block_id and an idle pool its counters.

    BUG: pagedctl prints MessageToDict without always-print, so proto3 drops every zero field.
    """
    register(stub, "json-zero", num_blocks=2, block_size=4)
    dumped = json.loads(pagedctl(server.target, "--json", "blocks", "json-zero").stdout)
    missing_in_block_0 = [key for key in ("block_id", "ref_count", "num_tokens")
                          if key not in dumped["blocks"][0]]
    (pool,) = json.loads(pagedctl(server.target, "--json", "stats", "--executor",
                                  "json-zero").stdout)["pools"]
    missing_in_stats = [key for key in ("num_used_blocks", "num_cached_free_blocks",
                                        "usage_percent", "num_sequences") if key not in pool]
    assert (missing_in_block_0, missing_in_stats) == ([], [])


def test_pagedctl_needs_the_token_of_a_protected_allocator(auth_server: AllocatorProcess) -> None:
    done = pagedctl(auth_server.target, "stats")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "pagedctl: UNAUTHENTICATED: missing 'authorization: Bearer <token>' metadata")
    assert pagedctl(auth_server.target, "--token", "wrong", "stats").stderr.startswith(
        "pagedctl: UNAUTHENTICATED: wrong bearer token")
    done = pagedctl(auth_server.target, "--token", TOKEN, "audit")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: ")


# -- start-up and shutdown ------------------------------------------------------------------------

def test_sigterm_stops_the_server_gracefully_with_exit_code_0(
        start_allocator: Callable[..., AllocatorProcess]) -> None:
    process = start_allocator()
    register(pb_grpc.AllocatorStub(process.channel()), "before-shutdown")
    started = time.monotonic()
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    process.stop()  # joins the log readers
    log = process.stderr_tail()
    assert "received SIGTERM, shutting down" in log and "stopped" in log
    assert "Traceback" not in log


def test_sigterm_right_after_the_ready_line_still_exits_gracefully() -> None:
    """The ready line tells launchers (`pagedserve up`, AllocatorProcess) the server can be
    managed, so a SIGTERM sent as soon as it appears must shut down in order (exit 0).

    BUG: the line is printed before run_until_signal installs the handlers, so such a SIGTERM
    meets the default disposition and kills the process (-15) most of the time.
    """
    exit_codes = []
    for _ in range(10):
        process = subprocess.Popen(
            [sys.executable, "-m", "allocator_service", "--host", "127.0.0.1", "--port", "0"],
            cwd=REPO_ROOT, env=hermetic_env(), stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        try:
            assert process.stdout is not None
            assert process.stdout.readline().startswith("allocator listening on 127.0.0.1:")
            process.send_signal(signal.SIGTERM)
            exit_codes.append(process.wait(timeout=10))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stdout.close()
    assert exit_codes == [0] * 10


def test_out_of_range_flag_stops_start_up_with_a_message() -> None:
    with pytest.raises(AllocatorStartError) as caught:
        AllocatorProcess("--lease-ttl", "0")
    assert "exit code 1" in str(caught.value)
    assert "--lease-ttl must be between 0.1 and 86400 seconds, got 0.0" in str(caught.value)
