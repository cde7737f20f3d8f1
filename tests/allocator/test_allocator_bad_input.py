"""Bad input against the real allocator: a refused request gets its status code and changes
nothing, an op that cannot apply reports its status and leaves the pool unchanged, and the
server keeps serving either way."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import text_format
from grpc_health.v1 import health_pb2

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import (Code, Executor, allocate, append, fork, free,
                                          health_status, pool_stats, rpc_error)
from tests.support.oversized_messages import (OVERSIZED_CHARS, OVERSIZED_INPUT, OVERSIZED_MESSAGE,
                                              oversized_channel)

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


@dataclass(frozen=True)
class Call:
    """A bad request: `shows` names what is sent (docs/reliability.md's table shows it), `send`
    sends it for executor `ex`, and `prepare`, if any, runs before the pool is snapshotted."""
    shows: str
    send: Callable[..., object]
    prepare: Callable[..., object] | None = None


def _one_line(op: pb.BlockOp) -> str:
    return text_format.MessageToString(op, as_one_line=True) or "BlockOp {}"


def _registration(**fields: object) -> Call:
    request = {"executor_id": "refused", "num_blocks": 8, "block_size": 4, **fields}
    return Call("RegisterExecutor " + " ".join(f"{k}={v!r}" for k, v in fields.items()),
                lambda stub, admin, ex: stub.RegisterExecutor(
                    pb.RegisterExecutorRequest(**request), timeout=5))


def _step(*ops: pb.BlockOp, executor_id: str = "", epoch_offset: int = 0,
          step_id: int = 1) -> Call:
    """A Step whose op 0 is valid and the rest are the ones under test."""
    if len(ops) > 2:
        shown = f"Step of {len(ops) + 1} ops"
    else:
        shown = " ".join(["Step", *(f"with ops[{i}] {_one_line(op)}"
                                    for i, op in enumerate(ops, 1))])
    shown += f" for executor {executor_id!r}" if executor_id else ""
    shown += f" at epoch +{epoch_offset}" if epoch_offset else ""
    shown += f" step_id={step_id}" if step_id != 1 else ""
    return Call(shown, lambda stub, admin, ex: stub.Step(pb.StepRequest(
        executor_id=executor_id or ex.executor_id, epoch=ex.epoch + epoch_offset,
        step_id=step_id, ops=[allocate("valid", [1, 2, 3]), *ops]), timeout=5))


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
    pytest.param(_registration(num_blocks=2**20, block_size=4096), Code.INVALID_ARGUMENT,
                 "num_blocks × block_size must be at most 134217728 token slots, got 1048576 × "
                 "4096 = 4294967296; at block_size 4096 a pool may have 32768 blocks",
                 id="pool-slots-past-the-limit"),
    pytest.param(_registration(executor_id=""), Code.INVALID_ARGUMENT, "executor_id is empty",
                 id="executor_id-empty"),
    pytest.param(_registration(executor_id="e" * 257), Code.INVALID_ARGUMENT,
                 "executor_id is 257 characters; the limit is 256", id="executor_id-too-long"),
    pytest.param(_registration(executor_index=-2), Code.INVALID_ARGUMENT,
                 "executor_index must be 0 or more (leave it unset for an executor without a "
                 "number), got -2", id="executor_index-negative"),
    pytest.param(Call("RegisterExecutor executor_index=7, held by another registered executor",
                      lambda stub, admin, ex: stub.RegisterExecutor(pb.RegisterExecutorRequest(
                          executor_id="refused", num_blocks=8, block_size=4, executor_index=7),
                          timeout=5),
                      prepare=lambda stub, admin, ex: stub.RegisterExecutor(
                          pb.RegisterExecutorRequest(executor_id="index-holder", num_blocks=8,
                                                     block_size=4, executor_index=7),
                          timeout=5)),
                 Code.ALREADY_EXISTS, "executor 'refused' registers as executor index 7, which "
                 "executor 'index-holder' holds", id="executor_index-taken"),
    pytest.param(_step(executor_id="nobody"), Code.NOT_FOUND,
                 "executor 'nobody' is not registered", id="step-unknown-executor"),
    pytest.param(_step(epoch_offset=1000), Code.FAILED_PRECONDITION,
                 "but its pool is at epoch", id="step-wrong-epoch"),
    pytest.param(_step(step_id=0), Code.INVALID_ARGUMENT, "step_id must be at least 1, got 0",
                 id="step-id-zero"),
    pytest.param(Call("Step step_id=1 again, with other ops than the applied step 1",
                      lambda stub, admin, ex: stub.Step(ex.request(1, allocate("other", [9])),
                                                        timeout=5),
                      prepare=lambda stub, admin, ex: ex.step(allocate("first", [1, 2]))),
                 Code.FAILED_PRECONDITION, "was already applied with different ops",
                 id="step-id-replayed-with-other-ops"),
    pytest.param(_step(*[free("x")] * 65536), Code.INVALID_ARGUMENT,
                 "a step carries at most 65536 ops, got 65537", id="step-too-many-ops"),
    pytest.param(_step(pb.BlockOp()), Code.INVALID_ARGUMENT,
                 "ops[1] sets no kind: set one of allocate, append, fork, free", id="op-no-kind"),
    pytest.param(_step(allocate("empty", [])), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): token_ids is empty", id="allocate-no-tokens"),
    pytest.param(_step(allocate("negative", [5, -7])), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): token ids must not be negative, got -7",
                 id="allocate-negative-token"),
    pytest.param(_step(pb.BlockOp(allocate=pb.AllocateOp(
        seq_id="packed", packed_token_ids=(5).to_bytes(4, "little") + (-7).to_bytes(
            4, "little", signed=True)))), Code.INVALID_ARGUMENT,
        "ops[1] (AllocateOp): token ids must not be negative, got -7",
        id="allocate-negative-packed-token"),
    pytest.param(_step(pb.BlockOp(append=pb.AppendOp(seq_id="x", packed_token_ids=b"\1\2"))),
                 Code.INVALID_ARGUMENT, "ops[1]: packed_token_ids is 2 bytes, not a multiple of 4",
                 id="append-packed-tokens-cut"),
    pytest.param(_step(allocate("", [1])), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): seq_id is empty", id="allocate-empty-seq_id"),
    pytest.param(_step(allocate("s" * 257, [1])), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): seq_id is 257 characters; the limit is 256",
                 id="allocate-seq_id-too-long"),
    pytest.param(_step(allocate("salty", [1], cache_salt="s" * 257)), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): cache_salt is longer than 256 characters",
                 id="allocate-cache_salt-too-long"),
    pytest.param(_step(allocate("ahead", [1], lookahead_slots=-1)), Code.INVALID_ARGUMENT,
                 "ops[1] (AllocateOp): lookahead_slots must be between 0 and 65536, got -1",
                 id="allocate-negative-lookahead"),
    pytest.param(_step(fork("valid", "valid")), Code.INVALID_ARGUMENT,
                 "ops[1] (ForkOp): parent_seq_id and child_seq_id are the same",
                 id="fork-onto-itself"),
    pytest.param(_step(append("valid", num_computed_tokens=-1)), Code.INVALID_ARGUMENT,
                 "ops[1] (AppendOp): num_computed_tokens must not be negative, got -1",
                 id="append-negative-computed"),
    pytest.param(Call("Heartbeat num_waiting=-1", lambda stub, admin, ex: stub.Heartbeat(
        pb.HeartbeatRequest(executor_id=ex.executor_id, epoch=ex.epoch, num_waiting=-1),
        timeout=5)),
        Code.INVALID_ARGUMENT, "num_waiting and num_running must not be negative",
        id="heartbeat-negative-num_waiting"),
    pytest.param(Call("Heartbeat at epoch +1", lambda stub, admin, ex: stub.Heartbeat(
        pb.HeartbeatRequest(executor_id=ex.executor_id, epoch=ex.epoch + 1), timeout=5)),
        Code.FAILED_PRECONDITION, "but its pool is at epoch", id="heartbeat-wrong-epoch"),
    pytest.param(Call("MatchPrefix with no token_ids", lambda stub, admin, ex: stub.MatchPrefix(
        pb.MatchPrefixRequest(), timeout=5)),
        Code.INVALID_ARGUMENT, "token_ids is empty", id="match_prefix-no-tokens"),
    pytest.param(Call("MatchPrefix token_ids=[1, -1]", lambda stub, admin, ex: stub.MatchPrefix(
        pb.MatchPrefixRequest(token_ids=[1, -1]), timeout=5)),
        Code.INVALID_ARGUMENT, "token ids must not be negative", id="match_prefix-negative-token"),
    pytest.param(Call("GetBlockTable seq_id='ghost'", lambda stub, admin, ex: admin.GetBlockTable(
        pb.GetBlockTableRequest(executor_id=ex.executor_id, seq_id="ghost"), timeout=5)),
        Code.NOT_FOUND, "no pool holds sequence 'ghost' on executor", id="block_table-unknown-seq"),
    pytest.param(Call("GetBlockTable with no seq_id", lambda stub, admin, ex: admin.GetBlockTable(
        pb.GetBlockTableRequest(executor_id=ex.executor_id), timeout=5)),
        Code.INVALID_ARGUMENT, "seq_id is empty", id="block_table-empty-seq_id"),
    pytest.param(Call("DumpBlocks with no executor_id", lambda stub, admin, ex: admin.DumpBlocks(
        pb.DumpBlocksRequest(), timeout=5)),
        Code.INVALID_ARGUMENT, "executor_id is empty; DumpBlocks shows one pool",
        id="dump_blocks-empty-executor_id"),
    pytest.param(Call("DumpBlocks executor_id='nobody'", lambda stub, admin, ex: admin.DumpBlocks(
        pb.DumpBlocksRequest(executor_id="nobody"), timeout=5)),
        Code.NOT_FOUND, "executor 'nobody' is not registered", id="dump_blocks-unknown-executor"),
    pytest.param(Call("GetStats executor_id='nobody'", lambda stub, admin, ex: admin.GetStats(
        pb.GetStatsRequest(executor_id="nobody"), timeout=5)),
        Code.NOT_FOUND, "executor 'nobody' is not registered", id="stats-unknown-executor"),
]


@pytest.mark.parametrize("call, code, message", REQUEST_ERRORS)
def test_bad_request_gets_its_status_code_changes_nothing_and_server_keeps_serving(
        server: AllocatorProcess, stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor], call: Call, code: grpc.StatusCode,
        message: str) -> None:
    ex = new_executor(num_blocks=4, block_size=4)
    if call.prepare is not None:
        call.prepare(stub, admin, ex)
    before = pool_snapshot(admin, ex.executor_id)
    error = rpc_error(lambda: call.send(stub, admin, ex))
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


# A Step by one executor naming another executor's sequences: ops apply to the caller's own pool
# only, so they find nothing there, and the other pool is untouched.
FOREIGN_OPS = [
    pytest.param(append("theirs", [7]), pb.OP_STATUS_NOT_FOUND,
                 "sequence 'theirs' is not allocated in this pool", id="append-to-theirs"),
    pytest.param(free("theirs"), pb.OP_STATUS_NOT_FOUND,
                 "sequence 'theirs' is not allocated in this pool", id="free-theirs"),
    pytest.param(fork("theirs", "stolen"), pb.OP_STATUS_NOT_FOUND,
                 "sequence 'theirs' is not allocated in this pool", id="fork-theirs"),
]


@pytest.mark.parametrize("op, status, message", FOREIGN_OPS)
def test_ops_naming_another_executors_sequence_find_nothing_and_leave_its_pool_alone(
        server: AllocatorProcess, stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor], op: pb.BlockOp, status: int,
        message: str) -> None:
    caller, owner = new_executor(num_blocks=4), new_executor(num_blocks=4)
    owner.step(allocate("theirs", [1, 2, 3, 4, 5]))
    owner_before = admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=owner.executor_id))
    caller_before = pool_snapshot(admin, caller.executor_id)
    (result,) = caller.step(op).results
    assert (result.status, message in result.message) == (status, True), result.message
    assert admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=owner.executor_id)) == owner_before
    assert pool_snapshot(admin, caller.executor_id)[1:] == caller_before[1:]
    assert_still_serving(server, stub, admin)


ALLOCATOR = "/pagedserve.allocator.v1.Allocator/"
# Requests as bytes on the wire: (method, body, status, what the message says). A field sent with
# another wire type than its own is an unknown field to protobuf, so it reads as unset.
WIRE_CASES = {
    "executor_id not UTF-8": ("RegisterExecutor", b"\x0a\x02\xff\xfe", Code.INVALID_ARGUMENT,
                              "String field had bad UTF-8"),
    "num_blocks sent as a string (wrong wire type)": (
        "RegisterExecutor", b"\x0a\x01a\x1a\x02hi\x20\x04", Code.INVALID_ARGUMENT,
        "num_blocks must be between 1 and 1048576, got 0"),
    "Step that is not protobuf": ("Step", b"\x18", Code.INVALID_ARGUMENT,
                                  "does not parse as its message"),
    "MatchPrefix over the size limit": ("MatchPrefix", OVERSIZED_INPUT,
                                        Code.RESOURCE_EXHAUSTED, OVERSIZED_MESSAGE),
}


@pytest.mark.parametrize("case", WIRE_CASES)
def test_bytes_that_are_no_valid_request_are_refused_by_status(
        server: AllocatorProcess, stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        case: str) -> None:
    method, body, code, message = WIRE_CASES[case]
    if body == OVERSIZED_INPUT:
        body = pb.MatchPrefixRequest(token_ids=[1], cache_salt="s" * OVERSIZED_CHARS)
        body = body.SerializeToString()
    with oversized_channel(server.target) as channel:
        call = channel.unary_unary(ALLOCATOR + method, request_serializer=lambda raw: raw,
                                   response_deserializer=lambda raw: raw)
        error = rpc_error(lambda: call(body, timeout=30))
    assert error.code() == code, error.details()
    assert message in error.details()
    assert_still_serving(server, stub, admin)
