"""Running out of blocks is a result, not an exception, and leaves the pool unchanged; asking
first (can_allocate, can_append) never mutates.

Exact ids on 11 blocks of 4 slots; see tests/support/allocator_core.py for the free list order
behind them.
"""
from __future__ import annotations

from allocator_service.core.executor_pool import Allocation, ExecutorPool
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, OpStatus
from tests.support.allocator_core import A9, free_ids, new_pool, registered, snapshot


def _pool_with_three_free_and_two_cached() -> ExecutorPool:
    pool = new_pool()
    pool.allocate("a", A9)
    pool.append("a", num_computed_tokens=9)
    pool.free("a")
    assert pool.allocate("filler", range(200, 232)) == Allocation([2, 3, 4, 5, 6, 7, 8, 9], 0)
    assert free_ids(pool) == [10, 1, 0]
    return pool


def test_allocate_out_of_blocks_returns_none_and_leaves_pool_unchanged():
    pool = _pool_with_three_free_and_two_cached()
    before = snapshot(pool)
    # 13 tokens: 4 blocks, 2 of them cached-free hits, so 4 free blocks consumed but 3 free.
    prompt = A9 + [40, 41, 42, 43]
    assert pool.can_allocate(prompt) is False
    assert pool.allocate("c", prompt) is None
    assert snapshot(pool) == before
    assert "c" not in pool.sequences

    # 9 tokens: 2 hits + 1 new block fit exactly.
    assert pool.allocate("c", A9) == Allocation([0, 1, 10], 8)
    assert free_ids(pool) == []


def test_append_out_of_blocks_for_copy_returns_none_and_leaves_pool_unchanged():
    pool = new_pool()
    pool.allocate("a", range(6))
    pool.fork("a", "c")
    pool.allocate("filler", range(200, 236))
    assert pool.num_free_blocks == 0
    before = snapshot(pool)

    assert pool.append("a", [6]) is None
    assert pool.append("a", (), lookahead_slots=3) is None
    assert snapshot(pool) == before
    assert pool.sequences["a"].unhashed_token_ids.tolist() == [0, 1, 2, 3, 4, 5]


def test_step_reports_out_of_blocks_and_later_ops_still_apply():
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("filler", tuple(range(40)))])
    result = allocator.step("e", 1, 2, [AllocateOp("big", tuple(range(100, 108))),
                                        AllocateOp("small", (7,))])
    big, small = result.results
    assert big.status == OpStatus.OUT_OF_BLOCKS
    assert big.message == "out of blocks: 1 of 11 free"
    assert big.block_table == []
    assert (small.status, small.block_table) == (OpStatus.OK, [10])
    assert result.num_free_blocks == 0
    assert sorted(executor.pool.sequences) == ["filler", "small"]

    (grow,) = allocator.step("e", 1, 3, [AppendOp("small", (1, 2, 3, 4))]).results
    assert grow.status == OpStatus.OUT_OF_BLOCKS
    assert executor.pool.sequences["small"].unhashed_token_ids.tolist() == [7]


def test_can_allocate_and_can_append_never_mutate():
    pool = _pool_with_three_free_and_two_cached()
    assert pool.allocate("s", [300, 301]) == Allocation([10], 0)
    assert pool.fork("s", "t") == [10]           # shares the partly filled block
    assert free_ids(pool) == [1, 0]              # both cached
    before = snapshot(pool)

    assert pool.can_allocate(A9) is False        # 2 cached-free hits + 1 new, but only 2 free
    assert pool.can_allocate(A9[:5]) is True     # 1 hit + 1 new
    assert pool.can_allocate(A9 + [1, 2, 3, 4], lookahead_slots=8) is False
    assert pool.can_append("s", 1) is True       # the copy takes one block
    assert pool.can_append("s", 3, lookahead_slots=2) is True    # copy + 1 new block
    assert pool.can_append("s", 3, lookahead_slots=4) is False   # copy + 2 new blocks
    assert pool.can_append("s", 0, lookahead_slots=2) is True    # no write, no copy
    assert pool.num_cached_prefix_tokens(A9, "") == 8
    assert snapshot(pool) == before
