"""Exact-id tests of the allocator core on small pools (11 blocks of 4 slots unless said).

Free list order is the thing to keep in mind when reading the expected ids: a fresh pool hands
out 0, 1, 2, ...; blocks without a cached prefix come back at the head (taken next), cached ones
at the tail, a sequence's first block last (so it is evicted last).
"""
from __future__ import annotations

import struct
from collections import Counter
from hashlib import blake2b

import pytest

from allocator_service.allocator import Allocator, ops_digest
from allocator_service.audit import audit_pool
from allocator_service.block_hash import BlockHash, chain_hash, root_hash
from allocator_service.errors import (InvalidOp, StaleEpoch, StepIdReused, StepIdTooOld,
                                      UnknownExecutor, UnknownSequence)
from allocator_service.executor_pool import ExecutorPool, PromptTooLarge
from allocator_service.inspection import BlockState, block_views, pool_stats
from allocator_service.limits import Limits
from allocator_service.ops import (AllocateOp, Allocation, AppendOp, ForkOp, FreeOp, Growth,
                                   OpStatus)
from pagedserve.common.errors import InvalidArgument

NUM_BLOCKS = 11
BLOCK_SIZE = 4

A9 = list(range(9))           # 2 full blocks + 1 token
A10 = list(range(10))         # 2 full blocks + 2 tokens
B9 = list(range(100, 109))


def constant_hash(parent: BlockHash, tokens) -> BlockHash:
    """Every block collides with every other."""
    return BlockHash(b"\0" * 16)


def parent_blind_hash(parent: BlockHash, tokens) -> BlockHash:
    """Ignores the chain: equal blocks after different prefixes collide."""
    return BlockHash(blake2b(struct.pack(f"<{len(tokens)}I", *tokens), digest_size=16).digest())


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_pool(hash_fn=chain_hash, fingerprint: str = "m") -> ExecutorPool:
    return ExecutorPool(NUM_BLOCKS, BLOCK_SIZE, fingerprint, hash_fn)


def free_ids(pool: ExecutorPool) -> list[int]:
    return [block.block_id for block in pool.blocks.free_list()]


def cached_ids(pool: ExecutorPool) -> list[int]:
    return sorted(block.block_id for block in pool.blocks.hash_index.values())


def table(pool: ExecutorPool, seq_id: str) -> list[int]:
    return pool.sequences[seq_id].block_ids()


def snapshot(pool: ExecutorPool):
    """Everything an operation could change, in a comparable form."""
    blocks = tuple((b.block_id, b.ref_count, b.block_hash, b.parent_hash, b.token_ids, b.node_id,
                    b.parent_key) for b in pool.blocks.blocks)
    sequences = {sid: (tuple(seq.block_ids()), tuple(seq.token_ids), seq.num_cached_tokens,
                       seq.num_computed_tokens, seq.num_hashed_blocks, seq.chain_hash,
                       seq.chain_key)
                 for sid, seq in pool.sequences.items()}
    index = {h: b.block_id for h, b in pool.blocks.hash_index.items()}
    return (blocks, tuple(free_ids(pool)), pool.num_free_blocks, sequences, index,
            pool.prefix_query_tokens, pool.prefix_hit_tokens)


def registered(**kwargs):
    """An allocator with executor 'e' (11 blocks of 4) registered at epoch 1."""
    allocator = Allocator(**kwargs)
    executor = allocator.register_executor("e", "host:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    assert executor.epoch == 1
    return allocator, executor


# -- prefix cache ---------------------------------------------------------------------------------

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
    assert pool.sequences["a"].token_ids == [0, 1, 2, 3, 4, 5, 6]
    assert pool.sequences["c"].token_ids == [0, 1, 2, 3, 4, 5, 7]
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


# -- free list order, LRU eviction ----------------------------------------------------------------

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


# -- out of blocks: a result, and nothing changes -------------------------------------------------

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
    assert pool.sequences["a"].token_ids == [0, 1, 2, 3, 4, 5]


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
    assert executor.pool.sequences["small"].token_ids == [7]


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
    assert executor.pool.sequences["a"].token_ids == [1, 2, 3, 4, 5]
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
    # The digest is what identifies the ops: a caller-supplied one is compared as is.
    assert allocator.step("e", 1, 1, [], digest=ops_digest([AllocateOp("a", (1,))])).replayed


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


# -- registration ---------------------------------------------------------------------------------

@pytest.mark.parametrize("executor_id, address, num_blocks, block_size", [
    ("e", "h", 0, 4),
    ("e", "h", -1, 4),
    ("e", "h", 17, 4),
    ("e", "h", 11, 0),
    ("e", "h", 11, 4097),
    ("", "h", 11, 4),
    ("x" * 257, "h", 11, 4),
    ("e", "a" * 257, 11, 4),
], ids=["no_blocks", "negative_blocks", "blocks_over_limit", "block_size_0",
        "block_size_over_limit", "empty_executor_id", "long_executor_id", "long_address"])
def test_invalid_registration_raises_invalid_argument(executor_id, address, num_blocks,
                                                      block_size):
    allocator = Allocator(limits=Limits(max_num_blocks=16))
    with pytest.raises(InvalidArgument):
        allocator.register_executor(executor_id, address, num_blocks, block_size, "m")
    assert allocator.executors == {}
    # A refused registration consumes no epoch; the limit itself is accepted.
    assert allocator.register_executor("e", "h", 16, 4096, "m").epoch == 1


def test_reregistration_gives_larger_epoch_and_empty_pool():
    allocator, _ = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(range(6)))])
    assert allocator.register_executor("f", "h", 3, 2, "m").epoch == 2

    second = allocator.register_executor("e", "host:2", 5, 2, "m2")
    assert second.epoch == 3
    assert allocator.executors["e"] is second
    assert second.pool.sequences == {}
    assert (second.pool.num_blocks, second.pool.block_size) == (5, 2)
    assert free_ids(second.pool) == [0, 1, 2, 3, 4]
    assert second.last_step_id == 0
    # Step ids start over with the new epoch.
    assert allocator.step("e", 3, 1, [AllocateOp("a", (1,))]).replayed is False


def test_stale_epoch_raises():
    allocator, _ = registered()
    allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    with pytest.raises(StaleEpoch, match="sent epoch 1 but its pool is at epoch 2"):
        allocator.step("e", 1, 1, [AllocateOp("a", (1,))])
    with pytest.raises(StaleEpoch):
        allocator.heartbeat("e", 1)
    assert allocator.executors["e"].pool.sequences == {}


def test_unknown_executor_raises():
    allocator, _ = registered()
    with pytest.raises(UnknownExecutor):
        allocator.step("ghost", 1, 1, [])
    with pytest.raises(UnknownExecutor):
        allocator.heartbeat("ghost", 1)
    with pytest.raises(UnknownExecutor):
        allocator.reset_prefix_cache("ghost")


# -- leases ---------------------------------------------------------------------------------------

def test_lease_expiry_reclaims_pool_whole():
    clock = FakeClock(100.0)
    allocator = Allocator(lease_ttl_s=10.0, clock=clock)
    executor = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(A9))])

    clock.now = 109.0
    assert allocator.expire_leases() == []
    assert allocator.lease_remaining(executor) == 1.0
    clock.now = 110.0
    assert allocator.expire_leases() == ["e"]
    assert allocator.executors == {}
    assert allocator.match_prefix(A9, "") == []
    with pytest.raises(UnknownExecutor):
        allocator.step("e", 1, 2, [FreeOp("a")])

    again = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    assert again.epoch == 2
    assert free_ids(again.pool) == list(range(11))


def test_heartbeat_renews_lease():
    clock = FakeClock(100.0)
    allocator = Allocator(lease_ttl_s=10.0, clock=clock)
    e = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    allocator.register_executor("f", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    clock.now = 109.0
    allocator.heartbeat("e", 1, num_waiting=3, num_running=-2)
    assert (e.num_waiting, e.num_running) == (3, 0)
    clock.now = 110.0
    assert allocator.expire_leases() == ["f"]
    assert allocator.lease_remaining(e) == 9.0
    clock.now = 119.0
    assert allocator.expire_leases() == ["e"]


def test_step_renews_lease():
    clock = FakeClock(100.0)
    allocator = Allocator(lease_ttl_s=10.0, clock=clock)
    e = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    clock.now = 105.0
    allocator.step("e", 1, 1, [])
    clock.now = 114.0
    assert allocator.expire_leases() == []
    assert allocator.lease_remaining(e) == 1.0
    # A replayed step is a sign of life too.
    allocator.step("e", 1, 1, [])
    clock.now = 123.0
    assert allocator.expire_leases() == []
    clock.now = 124.0
    assert allocator.expire_leases() == ["e"]


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


# -- reset_prefix_cache ---------------------------------------------------------------------------

def test_reset_prefix_cache_makes_identical_prompt_miss():
    allocator, executor = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(A9))])
    allocator.step("e", 1, 2, [AppendOp("a", num_computed_tokens=9), FreeOp("a")])
    assert allocator.match_prefix(A9, "")[0].num_cached_tokens == 8

    assert allocator.reset_prefix_cache("e") == 2
    assert allocator.reset_prefix_cache() == 0
    assert executor.pool.blocks.hash_index == {}
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


# -- statistics and audit -------------------------------------------------------------------------

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
    block.token_ids = (100, 101, 102, 999)
    assert audit_pool("e", pool) == [
        f"pool 'e': hash {block.block_hash.hex()} -> block 4: its stored tokens hash to "
        "something else"]


def test_audit_detects_sequence_tokens_disagreeing_with_cached_block():
    pool = _stats_scenario()
    pool.sequences["a"].token_ids[0] = 99
    assert audit_pool("e", pool) == [
        "pool 'e': sequence 'a' holds cached block 0 at position 0 with other tokens"]


def test_audit_detects_block_dropped_from_free_list():
    pool = _stats_scenario()
    pool.blocks.free_queue.remove(pool.blocks.blocks[10])
    assert audit_pool("e", pool) == [
        "pool 'e': block 10 has ref_count 0 and is not on the free list",
        "pool 'e': 4 used + 6 free != 11 blocks",
    ]


# -- block_hash -----------------------------------------------------------------------------------

def test_root_hash_matches_documented_encoding():
    # person "pagedserve-root", then each string as a little-endian u64 length and its bytes.
    encoded = b"\x02\0\0\0\0\0\0\0m1" + b"\x01\0\0\0\0\0\0\0t"
    expected = blake2b(encoded, digest_size=16, person=b"pagedserve-root").digest()
    assert root_hash("m1", "t") == expected
    assert root_hash("m1", "t").hex() == "81c0e0743e6229515d8fd0ca8918edcc"
    assert root_hash("m1", "t") == root_hash("m1", "t")


def test_chain_hash_matches_documented_encoding():
    parent = root_hash("m1", "t")
    packed = b"\x01\0\0\0\x02\0\0\0\x03\0\0\0\x04\0\0\0"
    assert chain_hash(parent, [1, 2, 3, 4]) == blake2b(parent + packed, digest_size=16).digest()
    assert chain_hash(parent, (1, 2, 3, 4)).hex() == "7fde6ed4be4a119a8ad38f8cf4262dc2"
    assert chain_hash(parent, [1, 2, 3, 4]) != chain_hash(parent, [1, 2, 4, 3])
    assert chain_hash(parent, [1, 2, 3, 4]) != chain_hash(root_hash("m1", ""), [1, 2, 3, 4])


def test_hashes_differ_with_salt_or_fingerprint():
    base = root_hash("m1", "")
    assert base.hex() == "698e078ea03b58f105517e6ffd5a9a0d"
    assert len({base, root_hash("m1", "t"), root_hash("m2", ""), root_hash("", "m1")}) == 4
    # The length prefix keeps the two fields apart.
    assert root_hash("ab", "c") != root_hash("a", "bc")


# -- core bugs found while writing these tests (expected to fail until fixed) ---------------------

def test_step_with_token_id_past_uint32_is_refused_before_any_op_applies():
    """BUG: validation bounds token ids below only; chain_hash packs them as uint32.

    A token >= 2**32 makes struct.pack raise in the middle of the step, after earlier ops
    applied and without recording the step, so a retry re-applies them (ALREADY_EXISTS).
    """
    allocator, executor = registered()
    with pytest.raises(InvalidOp):
        allocator.step("e", 1, 1, [AllocateOp("a", (1, 2, 3)),
                                   AllocateOp("b", (2**32,) * 5)])
    assert executor.pool.sequences == {}


def test_prefix_recomputed_after_its_cached_twin_lost_its_parent_is_cached_again():
    """BUG (cache efficiency): an index entry whose parent was evicted blocks re-caching.

    x and y run the same prompt at once; x caches block 0, y's block 1 is cached as its child.
    Block 0 is evicted, y's block 1 stays (an orphan at the tail of the free list). When q
    recomputes the prompt, register() takes the orphan for a collision, so q's block 1 is never
    cached and the prompt keeps missing its second block until the orphan is evicted.
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
    """BUG (cache efficiency), same root cause: after reset_prefix_cache a live sequence keeps
    registering its next blocks under its dropped identity; those entries take the hash slots,
    so nobody can cache that content again while they last (here: as long as a lives)."""
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
