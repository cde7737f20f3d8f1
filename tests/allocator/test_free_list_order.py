"""Free list order: where freed blocks go, which cached block is evicted first (LRU), hits.

A fresh pool hands out 0, 1, 2, ...; blocks without a cached prefix come back at the head (taken
next), cached ones at the tail, a sequence's first block last (so it is evicted last).
"""
from __future__ import annotations

from allocator_service.core.audit import audit_pool
from allocator_service.core.executor_pool import Allocation, ExecutorPool
from tests.support.allocator_core import A9, cached_ids, free_ids, new_pool

B9 = list(range(100, 109))


def _two_cached_sequences_freed() -> ExecutorPool:
    pool = new_pool()
    pool.allocate("a", A9)                       # [0, 1, 2]
    pool.allocate("b", B9)                       # [3, 4, 5]
    pool.append("a", num_computed_tokens=9)      # caches 0, 1
    pool.append("b", num_computed_tokens=9)      # caches 3, 4
    pool.free("a")
    pool.free("b")
    return pool


def test_freed_blocks_without_hash_go_to_head_and_cached_ones_to_tail_first_block_last():
    pool = new_pool()
    pool.allocate("a", A9)
    pool.allocate("b", B9)
    pool.append("a", num_computed_tokens=9)
    pool.append("b", num_computed_tokens=9)
    assert free_ids(pool) == [6, 7, 8, 9, 10]
    pool.free("a")
    assert free_ids(pool) == [2, 6, 7, 8, 9, 10, 1, 0]
    pool.free("b")
    assert free_ids(pool) == [5, 2, 6, 7, 8, 9, 10, 1, 0, 4, 3]


def test_eviction_takes_least_recently_freed_cached_blocks_first():
    pool = _two_cached_sequences_freed()
    assert cached_ids(pool) == [0, 1, 3, 4]

    # 8 fresh blocks: the 7 uncached free blocks, then the oldest cached one (a's second block).
    assert pool.allocate("c", range(200, 232)) == Allocation([5, 2, 6, 7, 8, 9, 10, 1], 0)
    assert cached_ids(pool) == [0, 3, 4]
    assert pool.num_cached_prefix_tokens(A9, "") == 4
    assert pool.num_cached_prefix_tokens(B9, "") == 8

    assert pool.allocate("d", [300]) == Allocation([0], 0)
    assert cached_ids(pool) == [3, 4]
    assert pool.num_cached_prefix_tokens(A9, "") == 0

    assert pool.allocate("e", [301]) == Allocation([4], 0)
    assert cached_ids(pool) == [3]
    assert pool.num_cached_prefix_tokens(B9, "") == 4

    assert pool.allocate("f", [302]) == Allocation([3], 0)
    assert cached_ids(pool) == []
    assert free_ids(pool) == []


def test_cache_hit_takes_block_from_middle_of_free_list():
    pool = _two_cached_sequences_freed()
    assert free_ids(pool) == [5, 2, 6, 7, 8, 9, 10, 1, 0, 4, 3]
    assert pool.allocate("c", A9) == Allocation([0, 1, 5], 8)
    assert free_ids(pool) == [2, 6, 7, 8, 9, 10, 4, 3]
    assert pool.num_free_blocks == 8
    assert audit_pool("e", pool) == []
