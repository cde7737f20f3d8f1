"""Fork shares blocks; the first write into a shared block copies it; lookahead reserves.

Exact ids on 11 blocks of 4 slots; see tests/support/allocator_core.py for the free list order
behind them.
"""
from __future__ import annotations

from allocator_service.core.audit import audit_pool
from allocator_service.core.executor_pool import Allocation, Growth
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, ForkOp, OpStatus
from tests.support.allocator_core import new_pool, registered, table

# -- fork and copy-on-write -----------------------------------------------------------------------

def test_fork_then_append_copies_shared_tail_block():
    pool = new_pool()
    assert pool.allocate("a", range(6)) == Allocation([0, 1], 0)
    assert pool.fork("a", "c") == [0, 1]
    assert [pool.blocks.blocks[i].ref_count for i in (0, 1)] == [2, 2]

    # The writer gets a private copy of the shared tail block (taken from the head: block 2).
    assert pool.append("a", [6]) == Growth([], [(1, 2)])
    assert table(pool, "a") == [0, 2]
    assert table(pool, "c") == [0, 1]
    assert [pool.blocks.blocks[i].ref_count for i in (0, 1, 2)] == [2, 1, 1]

    # The other holder now owns block 1 alone: it appends in place.
    assert pool.append("c", [7]) == Growth([], [])
    assert table(pool, "c") == [0, 1]
    assert pool.sequences["a"].unhashed_token_ids.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert pool.sequences["c"].unhashed_token_ids.tolist() == [0, 1, 2, 3, 4, 5, 7]
    assert pool.num_free_blocks == 8
    assert audit_pool("e", pool) == []


def test_fork_then_append_past_shared_tail_copies_and_grows():
    pool = new_pool()
    pool.allocate("a", range(6))
    pool.fork("a", "c")
    # 10 tokens need 3 blocks: the copy takes block 2 first, then the table grows by block 3.
    assert pool.append("a", [6, 7, 8, 9]) == Growth([3], [(1, 2)])
    assert table(pool, "a") == [0, 2, 3]
    assert table(pool, "c") == [0, 1]


def test_fork_shares_token_blocks_but_not_blocks_reserved_ahead():
    pool = new_pool()
    assert pool.allocate("a", range(4), lookahead_slots=4) == Allocation([0, 1], 0)
    assert pool.fork("a", "c") == [0]
    assert [pool.blocks.blocks[i].ref_count for i in (0, 1)] == [2, 1]
    # Block 0 is full: neither holder writes into it, so nobody copies.
    assert pool.append("c", [4]) == Growth([2], [])
    assert pool.append("a", [5]) == Growth([], [])
    assert table(pool, "a") == [0, 1]
    assert table(pool, "c") == [0, 2]


# -- lookahead ------------------------------------------------------------------------------------

def test_lookahead_reserves_blocks_that_next_appends_use():
    pool = new_pool()
    assert pool.allocate("a", range(5), lookahead_slots=3) == Allocation([0, 1], 0)
    assert pool.append("a", [5]) == Growth([], [])
    assert pool.append("a", [6, 7]) == Growth([], [])
    assert pool.num_free_blocks == 9
    # The 9th token needs a third block.
    assert pool.append("a", [8]) == Growth([2], [])
    # Reserving alone grows the table.
    assert pool.append("a", (), lookahead_slots=4) == Growth([3], [])
    assert pool.append("a", [9, 10, 11]) == Growth([], [])
    assert table(pool, "a") == [0, 1, 2, 3]
    # Reserving less than what is held gives nothing back.
    assert pool.append("a", [12], lookahead_slots=0) == Growth([], [])
    assert table(pool, "a") == [0, 1, 2, 3]
    assert pool.num_free_blocks == 7


def test_step_append_results_carry_copies_and_new_blocks():
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(range(6))), ForkOp("a", "c")])
    copied, grown, unchanged = allocator.step("e", 1, 2, [
        AppendOp("a", (6,)), AppendOp("c", (7, 8, 9), lookahead_slots=2), AppendOp("c", (1,)),
    ]).results
    assert (copied.status, copied.copies, copied.new_blocks) == (OpStatus.OK, [(1, 2)], [])
    # After a's copy, c holds block 1 alone: no copy; 9 tokens + 2 reserved need a third block.
    assert (grown.status, grown.copies, grown.new_blocks) == (OpStatus.OK, [], [3])
    assert (unchanged.status, unchanged.copies, unchanged.new_blocks) == (OpStatus.OK, [], [])
    assert table(executor.pool, "a") == [0, 2]
    assert table(executor.pool, "c") == [0, 1, 3]
