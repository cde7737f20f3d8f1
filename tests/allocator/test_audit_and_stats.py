"""Pool statistics and block views on one small scenario, and the audit catching damage.

Exact ids on 11 blocks of 4 slots; see tests/support/allocator_core.py for the free list order
behind them.
"""
from __future__ import annotations

from collections import Counter

from allocator_service.core.audit import audit_pool
from allocator_service.core.block_hash import pack_tokens
from allocator_service.core.executor_pool import Allocation, ExecutorPool
from allocator_service.core.inspection import BlockState, block_views, pool_stats
from tests.support.allocator_core import A10, new_pool


def _stats_scenario() -> ExecutorPool:
    pool = new_pool()
    pool.allocate("a", A10)                                    # [0, 1, 2]
    pool.append("a", num_computed_tokens=10)                   # caches 0, 1
    assert pool.allocate("b", A10[:8] + [50, 51, 52]) == Allocation([0, 1, 3], 8)
    assert pool.fork("a", "c") == [0, 1, 2]
    assert pool.allocate("d", range(100, 105)) == Allocation([4, 5], 0)
    pool.append("d", num_computed_tokens=5)                    # caches 4
    pool.free("d")                                             # 5 to the head, 4 to the tail
    return pool


def test_pool_stats_exact_on_small_scenario():
    pool = _stats_scenario()
    stats = pool_stats("e", pool)
    assert (stats.num_blocks, stats.num_used_blocks, stats.num_cached_free_blocks,
            stats.num_free_blocks) == (11, 4, 1, 6)
    # Blocks 0 and 1 full (4 + 4), block 2 holds a's 2 tokens, block 3 holds b's 3.
    assert stats.tokens_stored == 13
    assert stats.slots_allocated == 16
    assert stats.num_sequences == 3
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (26, 8)
    assert stats.refcount_histogram == Counter({3: 2, 2: 1, 1: 1})
    assert stats.usage_percent == 400 / 11
    assert stats.prefix_hit_rate == 8 / 26

    views = block_views(pool)
    assert [v.state for v in views] == ([BlockState.USED] * 4 + [BlockState.CACHED_FREE]
                                        + [BlockState.FREE] * 6)
    assert [v.ref_count for v in views[:5]] == [3, 3, 2, 1, 0]
    assert [v.num_tokens for v in views[:5]] == [4, 4, 2, 3, 0]
    assert views[4].block_hash == pool.blocks.blocks[4].block_hash != b""

    total = pool_stats("all", new_pool())
    total.add(stats)
    assert (total.num_blocks, total.num_free_blocks, total.num_used_blocks) == (22, 17, 4)
    assert total.block_size == 4


def test_audit_is_empty_for_healthy_pool():
    assert audit_pool("e", _stats_scenario()) == []


def test_audit_detects_ref_count_bumped_by_hand():
    pool = _stats_scenario()
    pool.blocks.blocks[3].ref_count += 1
    assert audit_pool("e", pool) == [
        "pool 'e': block 3 has ref_count 2 but 1 block-table references"]


def test_audit_detects_used_block_with_zero_ref_count():
    pool = _stats_scenario()
    pool.blocks.blocks[3].ref_count = 0
    assert audit_pool("e", pool) == [
        "pool 'e': block 3 has ref_count 0 and is not on the free list",
        "pool 'e': block 3 has ref_count 0 but 1 block-table references",
        "pool 'e': 3 used + 7 free != 11 blocks",
    ]


def test_audit_detects_cached_tokens_changed_by_hand():
    pool = _stats_scenario()
    block = pool.blocks.blocks[4]
    block.tokens = pack_tokens((100, 101, 102, 999))
    assert audit_pool("e", pool) == [
        f"pool 'e': hash {block.block_hash.hex()} -> block 4: its stored tokens hash to "
        "something else"]


def test_sequence_keeps_only_the_tokens_after_its_hashed_blocks():
    pool = _stats_scenario()
    a = pool.sequences["a"]
    assert (a.num_tokens, a.num_hashed_blocks, a.unhashed_token_ids.tolist()) == (10, 2, A10[8:])
    pool.append("a", [60, 61], num_computed_tokens=12)  # fills and hashes block 2
    assert (a.num_tokens, a.num_hashed_blocks, a.unhashed_token_ids.tolist()) == (12, 3, [])
    # Block 2 is a copy: c shares the old one.
    assert pool.blocks.block(a.block_table[2]).token_ids == (*A10[8:], 60, 61)
    assert audit_pool("e", pool) == []


def test_audit_detects_sequence_chain_disagreeing_with_its_cached_blocks():
    pool = _stats_scenario()
    a = pool.sequences["a"]
    a.chain_hash = pool.blocks.blocks[0].block_hash  # as if the sequence held block 0's tokens
    assert audit_pool("e", pool) == [
        f"pool 'e': sequence 'a': its cached blocks chain to hash "
        f"{pool.blocks.blocks[1].block_hash.hex()}, but it continues from "
        f"{pool.blocks.blocks[0].block_hash.hex()}"]


def test_audit_detects_unhashed_tokens_disagreeing_with_cached_block():
    pool = new_pool()
    pool.allocate("x", range(8))
    pool.fork("x", "y")  # y shares x's two full blocks, neither hashed yet
    pool.append("x", num_computed_tokens=8)  # x caches them; y will hash them later
    assert audit_pool("e", pool) == []
    pool.sequences["y"].unhashed_token_ids[0] = 99
    assert audit_pool("e", pool) == [
        "pool 'e': sequence 'y' holds cached block 0 at position 0 with other tokens"]


def test_audit_detects_unhashed_tokens_of_the_wrong_length():
    pool = _stats_scenario()
    pool.sequences["a"].unhashed_token_ids.append(7)
    assert audit_pool("e", pool) == ["pool 'e': sequence 'a' keeps 3 unhashed tokens, not 10 - 8"]


def test_audit_detects_block_dropped_from_free_list():
    pool = _stats_scenario()
    pool.blocks.free_queue.remove(10)
    assert audit_pool("e", pool) == [
        "pool 'e': block 10 has ref_count 0 and is not on the free list",
        "pool 'e': 4 used + 6 free != 11 blocks",
    ]
