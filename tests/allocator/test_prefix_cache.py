"""The prefix cache of one pool: hits, what gets cached, collisions, salts, reset, re-caching.

Exact ids on 11 blocks of 4 slots; see tests/support/allocator_core.py for the free list order
behind them.
"""
from __future__ import annotations

from hashlib import blake2b

import pytest

from allocator_service.core.allocator import Allocator
from allocator_service.core.audit import audit_pool
from allocator_service.core.block_hash import BlockHash
from allocator_service.core.executor_pool import Allocation, Growth
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, FreeOp
from tests.support.allocator_core import (A9, A10, BLOCK_SIZE, NUM_BLOCKS, cached_ids, free_ids,
                                          new_pool, registered, table)


def constant_hash(parent: BlockHash, tokens) -> BlockHash:
    """Every block collides with every other."""
    return BlockHash(b"\0" * 16)


def parent_blind_hash(parent: BlockHash, tokens: bytes) -> BlockHash:
    """Ignores the chain: equal blocks after different prefixes collide."""
    return BlockHash(blake2b(tokens, digest_size=16).digest())


# -- hits and what gets cached --------------------------------------------------------------------

def test_prefix_hit_returns_cached_blocks_and_cached_token_count():
    pool = new_pool()
    assert pool.allocate("a", A10) == Allocation([0, 1, 2], 0)
    assert pool.append("a", num_computed_tokens=10) == Growth([], [])
    assert cached_ids(pool) == [0, 1]

    assert pool.allocate("b", A10[:8] + [50, 51, 52]) == Allocation([0, 1, 3], 8)
    assert [pool.blocks.blocks[i].ref_count for i in (0, 1, 2, 3)] == [2, 2, 1, 1]
    assert (pool.prefix_query_tokens, pool.prefix_hit_tokens) == (21, 8)
    assert pool.sequences["b"].num_computed_tokens == 8


def test_prompt_of_exact_block_multiple_never_hits_its_last_block():
    pool = new_pool()
    a8 = list(range(8))
    pool.allocate("a", a8)
    pool.append("a", num_computed_tokens=8)
    assert cached_ids(pool) == [0, 1]

    assert pool.num_cached_prefix_tokens(a8, "") == 4
    assert pool.allocate("b", a8) == Allocation([0, 2], 4)
    # One more token and the second block is no longer the one holding the last token.
    assert pool.allocate("c", a8 + [99]) == Allocation([0, 1, 3], 8)


def test_blocks_not_reported_computed_are_not_reusable():
    pool = new_pool()
    pool.allocate("a", A10)
    assert pool.allocate("b", A10) == Allocation([3, 4, 5], 0)
    assert cached_ids(pool) == []

    # 7 computed tokens complete only the first block.
    pool.append("a", num_computed_tokens=7)
    assert cached_ids(pool) == [0]
    assert pool.allocate("c", A10) == Allocation([0, 6, 7], 4)


def test_computed_mark_is_capped_at_length_and_never_decreases():
    pool = new_pool()
    pool.allocate("a", A10)
    pool.append("a", num_computed_tokens=100)
    assert pool.sequences["a"].num_computed_tokens == 10
    pool.append("a", num_computed_tokens=3)
    assert pool.sequences["a"].num_computed_tokens == 10
    assert pool.sequences["a"].num_hashed_blocks == 2


# -- collisions, salts, fingerprints --------------------------------------------------------------

def test_hash_collision_never_serves_block_with_other_tokens():
    pool = new_pool(hash_fn=constant_hash)
    assert pool.allocate("a", [1, 2, 3, 4, 5]) == Allocation([0, 1], 0)
    pool.append("a", num_computed_tokens=5)
    assert cached_ids(pool) == [0]

    # Same hash, other tokens: a miss, and b's block does not displace a's index entry.
    assert pool.allocate("b", [9, 9, 9, 9, 5]) == Allocation([2, 3], 0)
    pool.append("b", num_computed_tokens=5)
    assert cached_ids(pool) == [0]
    assert pool.num_cached_prefix_tokens([9, 9, 9, 9, 5], "") == 0

    # The owner of the entry still hits.
    assert pool.allocate("c", [1, 2, 3, 4, 6]) == Allocation([0, 4], 4)
    assert audit_pool("e", pool) == []


@pytest.mark.parametrize("hash_fn, expected", [
    # Every hash equal: b's first block is refused by the tokens check already.
    (constant_hash, Allocation([6, 7, 8], 0)),
    # b's first block is cached under its own hash; its second block collides with a's second
    # block, which follows another prefix, so that one is a miss.
    (parent_blind_hash, Allocation([3, 6, 7], 4)),
], ids=["constant", "parent_blind"])
def test_prompts_differing_only_in_first_block_never_share_second_block(hash_fn, expected):
    p1 = [1, 1, 1, 1, 5, 5, 5, 5, 7]
    p2 = [2, 2, 2, 2, 5, 5, 5, 5, 7]
    pool = new_pool(hash_fn=hash_fn)
    assert pool.allocate("a", p1) == Allocation([0, 1, 2], 0)
    pool.append("a", num_computed_tokens=9)
    assert pool.allocate("b", p2) == Allocation([3, 4, 5], 0)
    pool.append("b", num_computed_tokens=9)

    allocation = pool.allocate("c", p2)
    assert allocation == expected
    assert 1 not in allocation.block_table
    assert audit_pool("e", pool) == []


def test_different_cache_salt_never_shares_blocks():
    pool = new_pool()
    assert pool.allocate("a", A9, cache_salt="t1") == Allocation([0, 1, 2], 0)
    pool.append("a", num_computed_tokens=9)
    assert pool.allocate("b", A9, cache_salt="t2") == Allocation([3, 4, 5], 0)
    assert pool.num_cached_prefix_tokens(A9, "") == 0
    assert pool.allocate("c", A9, cache_salt="t1") == Allocation([0, 1, 6], 8)


def test_different_model_fingerprint_never_shares_hashes():
    pools = {fp: new_pool(fingerprint=fp) for fp in ("m1", "m2")}
    twin = new_pool(fingerprint="m1")
    for pool in (*pools.values(), twin):
        pool.allocate("a", A9)
        pool.append("a", num_computed_tokens=9)
    keys = {fp: set(pool.blocks.hash_index) for fp, pool in pools.items()}
    assert len(keys["m1"]) == 2
    assert keys["m1"].isdisjoint(keys["m2"])
    assert keys["m1"] == set(twin.blocks.hash_index)


def test_router_match_reports_cached_tokens_per_executor():
    allocator = Allocator()
    e1 = allocator.register_executor("e1", "h1", NUM_BLOCKS, BLOCK_SIZE, "m")
    allocator.register_executor("e2", "h2", NUM_BLOCKS, BLOCK_SIZE, "m")
    allocator.step("e1", e1.epoch, 1, [AllocateOp("a", tuple(A9))])
    allocator.step("e1", e1.epoch, 2, [AppendOp("a", num_computed_tokens=9)])
    matches = allocator.match_prefix(A9 + [50], "")
    assert [(m.executor_id, m.num_cached_tokens, m.num_free_blocks, m.num_sequences)
            for m in matches] == [("e1", 8, 8, 1), ("e2", 0, 11, 0)]
    assert [m.num_cached_tokens for m in allocator.match_prefix(A9 + [50], "other")] == [0, 0]


# -- reset_prefix_cache ---------------------------------------------------------------------------

def test_reset_prefix_cache_makes_identical_prompt_miss():
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(A9))])
    allocator.step("e", 1, 2, [AppendOp("a", num_computed_tokens=9), FreeOp("a")])
    assert allocator.match_prefix(A9, "")[0].num_cached_tokens == 8

    assert allocator.reset_prefix_cache("e") == 2
    assert allocator.reset_prefix_cache() == 0
    assert len(executor.pool.blocks.hash_index) == 0
    (again,) = allocator.step("e", 1, 3, [AllocateOp("b", tuple(A9))]).results
    assert (again.block_table, again.num_cached_tokens) == ([2, 3, 4], 0)
    assert audit_pool("e", executor.pool) == []


def test_reset_prefix_cache_keeps_live_sequences_and_their_later_blocks_never_match():
    pool = new_pool()
    pool.allocate("a", A9)
    pool.append("a", num_computed_tokens=9)
    assert pool.reset_prefix_cache() == 2
    assert table(pool, "a") == [0, 1, 2]
    assert [pool.blocks.blocks[i].ref_count for i in (0, 1, 2)] == [1, 1, 1]

    # a keeps hashing its third block, but under an identity no lookup can reach.
    pool.append("a", [9, 10, 11], num_computed_tokens=12)
    assert pool.num_cached_prefix_tokens(A9 + [9, 10, 11, 12], "") == 0
    assert pool.allocate("b", A9 + [9, 10, 11, 12]) == Allocation([3, 4, 5, 6], 0)
    assert audit_pool("e", pool) == []


# -- re-caching content whose index entry became unreachable --------------------------------------

def test_prefix_recomputed_after_its_cached_twin_lost_its_parent_is_cached_again():
    """An index entry whose parent was evicted does not keep the same content from re-caching.

    x and y run the same prompt at once; x caches block 0, y's block 1 is cached as its child.
    Block 0 is evicted, y's block 1 stays (an orphan at the tail of the free list). When q
    recomputes the prompt, its block 1 replaces the unreachable orphan in the index instead of
    being taken for a collision, so the next identical prompt hits both full blocks.
    """
    pool = new_pool()
    assert pool.allocate("x", A9) == Allocation([0, 1, 2], 0)
    assert pool.allocate("y", A9) == Allocation([3, 4, 5], 0)
    pool.append("x", num_computed_tokens=4)
    pool.append("y", num_computed_tokens=9)
    pool.free("x")
    pool.free("y")
    assert free_ids(pool) == [3, 5, 1, 2, 6, 7, 8, 9, 10, 0, 4]
    pool.allocate("z", range(100, 140))          # evicts block 0, keeps block 4
    pool.free("z")
    assert cached_ids(pool) == [4]

    assert pool.allocate("q", A9).num_cached_tokens == 0
    pool.append("q", num_computed_tokens=9)
    pool.free("q")
    assert pool.allocate("r", A9).num_cached_tokens == 8


def test_prefix_recomputed_after_reset_is_cached_again_while_old_holder_lives():
    """Same rule after reset_prefix_cache: a live sequence keeps registering its next blocks
    under its dropped identity; those unreachable entries give way when another sequence
    recomputes that content, so it is cached again while a still lives."""
    pool = new_pool()
    prompt = list(range(13))
    assert pool.allocate("a", prompt) == Allocation([0, 1, 2, 3], 0)
    pool.append("a", num_computed_tokens=4)
    assert pool.reset_prefix_cache() == 1
    pool.append("a", num_computed_tokens=13)     # blocks 1 and 2 indexed under a dead parent

    assert pool.allocate("q", prompt) == Allocation([4, 5, 6, 7], 0)
    pool.append("q", num_computed_tokens=13)
    pool.free("q")
    assert pool.allocate("r", prompt).num_cached_tokens == 12
