"""Bearer-token auth on the real allocator: every RPC refuses a missing or wrong token and
answers with the right one; health and reflection need none."""
from __future__ import annotations

import pytest

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import (TOKEN, Code, allocate,
                                          assert_health_and_reflection_answer, register, rpc_error,
                                          seq_ids)

pytestmark = pytest.mark.timeout(60)


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
    ("AllocatorAdmin", "StreamEvents", pb.StreamEventsRequest()),
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
    error = rpc_error(lambda: list(call(request_message, timeout=5)) if method == "StreamEvents"
                      else call(request_message, timeout=5))
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
    events = list(admin.StreamEvents(pb.StreamEventsRequest(), timeout=5))
    assert [(e.type, e.reason) for e in events] == [
        (pb.KV_EVENT_TYPE_POOL_RESET, "registered"),
        (pb.KV_EVENT_TYPE_POOL_RESET, "prefix_cache_reset")]
