"""Bad input against the real allocator: a refused request gets its status code and changes
nothing, an op that cannot apply reports its status and leaves the pool unchanged, and the
server keeps serving either way."""
from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2

from allocator_process import AllocatorProcess
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from wire_helpers import (Code, Executor, allocate, append, fork, free, health_status,
                          pool_stats, rpc_error)

pytestmark = pytest.mark.timeout(60)


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
