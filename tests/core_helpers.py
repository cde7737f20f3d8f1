"""Shared helpers of the allocator-core tests: small pools (11 blocks of 4 slots) and views.

Free list order is the thing to keep in mind when reading the expected ids: a fresh pool hands
out 0, 1, 2, ...; blocks without a cached prefix come back at the head (taken next), cached ones
at the tail, a sequence's first block last (so it is evicted last).
"""
from __future__ import annotations

from allocator_service.allocator import Allocator
from allocator_service.block_hash import chain_hash
from allocator_service.executor_pool import ExecutorPool

NUM_BLOCKS = 11
BLOCK_SIZE = 4

A9 = list(range(9))           # 2 full blocks + 1 token
A10 = list(range(10))         # 2 full blocks + 2 tokens


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
