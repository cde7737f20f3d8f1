"""Steps: per-op statuses for ops that cannot apply, idempotent retries, whole-step validation.

Caller errors inside a Step are per-op statuses; below it (ExecutorPool) they are exceptions.
Exact ids on 11 blocks of 4 slots; see tests/support/allocator_core.py for the free list order
behind them.
"""
from __future__ import annotations

from array import array

import pytest

from allocator_service.core.errors import StepIdReused, StepIdTooOld, UnknownSequence
from allocator_service.core.executor_pool import PromptTooLarge
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, ForkOp, FreeOp, InvalidOp, OpStatus
from pagedserve.protocol.limits import Limits
from tests.support.allocator_core import free_ids, new_pool, registered, snapshot

# -- caller errors: per-op statuses in a Step, exceptions below it --------------------------------

def test_prompt_larger_than_pool_is_too_large():
    allocator, _ = registered()
    too_big, look_past, fits = allocator.step("e", 1, 1, [
        AllocateOp("big", tuple(range(45))),
        AllocateOp("ahead", tuple(range(41)), lookahead_slots=4),
        AllocateOp("fits", tuple(range(44))),
    ]).results
    assert too_big.status == OpStatus.TOO_LARGE
    assert too_big.message == ("45 tokens (+0 reserved) need 12 blocks of 4 slots but the pool "
                               "has only 11")
    assert look_past.status == OpStatus.TOO_LARGE
    assert (fits.status, fits.block_table) == (OpStatus.OK, list(range(11)))

    with pytest.raises(PromptTooLarge):
        new_pool().allocate("big", range(45))
    with pytest.raises(PromptTooLarge):
        new_pool().can_allocate(range(45))


def test_unknown_sequence_ops_report_not_found_in_step():
    allocator, executor = registered()
    results = allocator.step("e", 1, 1, [AppendOp("ghost", (1,)), ForkOp("ghost", "kid"),
                                         FreeOp("ghost")]).results
    assert [r.status for r in results] == [OpStatus.NOT_FOUND] * 3
    assert results[0].message == ("sequence 'ghost' is not allocated in this pool (never "
                                  "allocated, or already freed)")
    assert executor.pool.sequences == {}
    assert executor.pool.num_free_blocks == 11


def test_double_free_reports_not_found():
    allocator, executor = registered()
    results = allocator.step("e", 1, 1, [AllocateOp("a", (1, 2, 3, 4, 5)), FreeOp("a"),
                                         FreeOp("a")]).results
    assert [r.status for r in results] == [OpStatus.OK, OpStatus.OK, OpStatus.NOT_FOUND]
    assert free_ids(executor.pool) == list(range(11))


def test_unknown_sequence_raises_on_executor_pool():
    pool = new_pool()
    pool.allocate("a", [1])
    pool.free("a")
    for call in (lambda: pool.append("a", [1]), lambda: pool.free("a"),
                 lambda: pool.fork("a", "b"), lambda: pool.can_append("a", 1)):
        with pytest.raises(UnknownSequence, match="'a' is not allocated"):
            call()
    assert "b" not in pool.sequences


def test_duplicate_sequence_id_reports_already_exists():
    allocator, executor = registered()
    results = allocator.step("e", 1, 1, [
        AllocateOp("a", (1, 2, 3, 4, 5)), AllocateOp("a", (9,)),
        ForkOp("a", "b"), ForkOp("a", "b"), ForkOp("b", "a"),
    ]).results
    assert [r.status for r in results] == [OpStatus.OK, OpStatus.ALREADY_EXISTS, OpStatus.OK,
                                           OpStatus.ALREADY_EXISTS, OpStatus.ALREADY_EXISTS]
    assert executor.pool.sequences["a"].unhashed_token_ids.tolist() == [1, 2, 3, 4, 5]
    assert executor.pool.num_free_blocks == 9
    assert [executor.pool.blocks.blocks[i].ref_count for i in (0, 1)] == [2, 2]


# -- step idempotency and validation --------------------------------------------------------------

def test_step_retry_with_same_ops_replays_recorded_result_and_applies_nothing():
    allocator, executor = registered()
    ops = [AllocateOp("a", tuple(range(6))), AllocateOp("b", (1,))]
    first = allocator.step("e", 1, 1, ops)
    assert first.replayed is False
    before = snapshot(executor.pool)

    again = allocator.step("e", 1, 1, list(ops))
    assert again.replayed is True
    assert again.results == first.results
    assert [r.block_table for r in again.results] == [[0, 1], [2]]
    assert again.num_free_blocks == first.num_free_blocks == 8
    assert first.replayed is False
    assert snapshot(executor.pool) == before
    assert executor.last_step_id == 1


def test_step_id_reused_with_different_ops_raises():
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", (1,))])
    before = snapshot(executor.pool)
    with pytest.raises(StepIdReused):
        allocator.step("e", 1, 1, [AllocateOp("b", (1,))])
    with pytest.raises(StepIdReused):
        allocator.step("e", 1, 1, [])
    assert snapshot(executor.pool) == before


def test_caller_digest_identifies_the_request_on_retry():
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", (1,))], digest=b"request-1")
    before = snapshot(executor.pool)
    # The server passes a digest of the serialized request: equal digest, same request.
    assert allocator.step("e", 1, 1, [AllocateOp("a", (1,))], digest=b"request-1").replayed
    with pytest.raises(StepIdReused):
        allocator.step("e", 1, 1, [AllocateOp("a", (1,))], digest=b"request-2")
    assert snapshot(executor.pool) == before


def test_step_id_older_than_kept_log_raises_too_old():
    allocator, executor = registered(step_log_size=2)
    steps = {i: [AllocateOp(f"s{i}", (i,))] for i in (1, 2, 3)}
    for step_id, ops in steps.items():
        allocator.step("e", 1, step_id, ops)
    assert list(executor.step_log) == [2, 3]
    with pytest.raises(StepIdTooOld):
        allocator.step("e", 1, 1, steps[1])
    assert allocator.step("e", 1, 2, steps[2]).replayed is True
    assert sorted(executor.pool.sequences) == ["s1", "s2", "s3"]


@pytest.mark.parametrize("bad_op", [
    AllocateOp("", (1,)),
    AllocateOp("b", (1, -1)),
    AllocateOp("b", ()),
    AllocateOp("x" * 257, (1,)),
    AllocateOp("b", (1,), cache_salt="s" * 257),
    AllocateOp("b", (1,), lookahead_slots=-1),
    AllocateOp("b", (1,), lookahead_slots=(1 << 16) + 1),
    AppendOp("", (1,)),
    AppendOp("a", (-3,)),
    AppendOp("a", (1,), lookahead_slots=-1),
    AppendOp("a", num_computed_tokens=-1),
    ForkOp("a", "a"),
    ForkOp("", "b"),
    ForkOp("a", ""),
    FreeOp(""),
    object(),
], ids=["empty_seq_id", "negative_token", "empty_allocate", "long_seq_id", "long_salt",
        "negative_lookahead", "huge_lookahead", "append_empty_seq_id", "append_negative_token",
        "append_negative_lookahead", "negative_computed", "fork_to_itself", "fork_no_parent",
        "fork_no_child", "free_empty_seq_id", "no_kind"])
def test_malformed_op_refuses_whole_step_and_applies_nothing(bad_op):
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(range(6)))])
    before = snapshot(executor.pool)

    with pytest.raises(InvalidOp, match=r"^ops\[2\] "):
        allocator.step("e", 1, 2, [AllocateOp("ok", (1, 2, 3)), FreeOp("a"), bad_op])
    assert snapshot(executor.pool) == before
    assert executor.last_step_id == 1
    # The refused step id was not consumed.
    assert allocator.step("e", 1, 2, [FreeOp("a")]).results[0].status == OpStatus.OK


def test_too_many_ops_refuses_whole_step():
    allocator, executor = registered(limits=Limits(max_ops_per_step=2))
    with pytest.raises(InvalidOp, match="^a step carries at most 2 ops, got 3$"):
        allocator.step("e", 1, 1, [AllocateOp("a", (1,)), AllocateOp("b", (1,)),
                                   AllocateOp("c", (1,))])
    assert executor.pool.sequences == {}
    assert executor.last_step_id == 0


def test_step_id_below_one_is_invalid():
    allocator, executor = registered()
    with pytest.raises(InvalidOp, match="at least 1, got 0"):
        allocator.step("e", 1, 0, [AllocateOp("a", (1,))])
    assert executor.pool.sequences == {}


def test_step_with_token_id_past_uint32_is_refused_before_any_op_applies():
    """Token ids are bounded above as well as below: chain_hash packs them as 32-bit values.

    A token >= 2**32 is refused with the whole step, before any op applies; left to struct.pack
    it would fail in the middle of the step, after earlier ops applied and without recording the
    step, and a retry would re-apply them (ALREADY_EXISTS).
    """
    allocator, executor = registered()
    with pytest.raises(InvalidOp):
        allocator.step("e", 1, 1, [AllocateOp("a", (1, 2, 3)),
                                   AllocateOp("b", (2**32,) * 5)])
    assert executor.pool.sequences == {}


@pytest.mark.parametrize("make_op", [
    lambda ids: AllocateOp("b", ids), lambda ids: AppendOp("a", ids)], ids=["allocate", "append"])
def test_negative_token_id_in_a_packed_array_is_refused_before_any_op_applies(make_op):
    """Packed ids decode to an int32 array, checked by its sign bytes rather than min()."""
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", (1, 2, 3))])
    with pytest.raises(InvalidOp, match=r"ops\[1\].*must not be negative, got -7"):
        allocator.step("e", 1, 2, [FreeOp("a"), make_op(array("i", [4, -7, 2**31 - 1]))])
    assert list(executor.pool.sequences) == ["a"]
    assert allocator.step("e", 1, 2, [make_op(array("i", [4, 0, 2**31 - 1]))]).results[0].status \
        == OpStatus.OK
