"""Shared helpers of the allocator-core tests: small pools (11 blocks of 4 slots) and views.

Free list order is the thing to keep in mind when reading the expected ids: a fresh pool hands
out 0, 1, 2, ...; blocks without a cached prefix come back at the head (taken next), cached ones
at the tail, a sequence's first block last (so it is evicted last).
"""
from __future__ import annotations

from hashlib import blake2b

from allocator_service.core.allocator import Allocator
from allocator_service.core.block_hash import BlockHash, hash_packed
from allocator_service.core.executor_pool import ExecutorPool
from allocator_service.core.inspection import block_views

NUM_BLOCKS = 11
BLOCK_SIZE = 4

A9 = list(range(9))           # 2 full blocks + 1 token
A10 = list(range(10))         # 2 full blocks + 2 tokens


def new_pool(hash_fn=hash_packed, fingerprint: str = "m") -> ExecutorPool:
    return ExecutorPool(NUM_BLOCKS, BLOCK_SIZE, fingerprint, hash_fn)


def free_ids(pool: ExecutorPool) -> list[int]:
    return pool.blocks.free_block_ids()


def cached_ids(pool: ExecutorPool) -> list[int]:
    return sorted(pool.blocks.hash_index.values())


def table(pool: ExecutorPool, seq_id: str) -> list[int]:
    return pool.sequences[seq_id].block_ids()


def snapshot(pool: ExecutorPool):
    """Everything an operation could change, in a comparable form."""
    blocks = tuple((b.block_id, b.ref_count, b.block_hash, b.parent_hash, b.token_ids, b.node_id,
                    b.parent_key) for b in pool.blocks.blocks)
    sequences = {sid: (tuple(seq.block_ids()), seq.num_tokens, tuple(seq.unhashed_token_ids),
                       seq.num_cached_tokens, seq.num_computed_tokens, seq.num_hashed_blocks,
                       seq.chain_hash, seq.chain_key)
                 for sid, seq in pool.sequences.items()}
    index = {h: b.block_id for h, b in pool.blocks.index_entries()}
    return (blocks, tuple(free_ids(pool)), pool.num_free_blocks, sequences, index,
            pool.prefix_query_tokens, pool.prefix_hit_tokens)


def registered(**kwargs):
    """An allocator with executor 'e' (11 blocks of 4) registered at epoch 1."""
    allocator = Allocator(**kwargs)
    executor = allocator.register_executor("e", "host:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    assert executor.epoch == 1
    return allocator, executor


# -- whole-core helpers (snapshot, journal and KV-event tests) -----------------------------------

def step_digest_of(executor_id: str, epoch: int, step_id: int, ops) -> bytes:
    """A stand-in for the server's request digest: steps identified by one can be snapshotted."""
    return blake2b(repr((executor_id, epoch, step_id, list(ops))).encode(), digest_size=16).digest()


def step(core: Allocator, executor_id: str, *ops):
    """One Step of `ops` at the executor's current epoch and next step id, with a digest."""
    executor = core.executors[executor_id]
    step_id = executor.last_step_id + 1
    return core.step(executor_id, executor.epoch, step_id, list(ops),
                     step_digest_of(executor_id, executor.epoch, step_id, ops))


def weak_hash(parent: BlockHash, tokens: bytes) -> BlockHash:
    """Two possible values: most blocks collide, after the same prefix or another one."""
    return BlockHash(bytes([(parent[0] + sum(tokens)) % 2]) * 16)


def parent_blind_hash(parent: BlockHash, tokens: bytes) -> BlockHash:
    """Ignores the chain: equal blocks after different prefixes collide."""
    return BlockHash(blake2b(tokens, digest_size=16).digest())


def core_state(core: Allocator) -> dict:
    """Everything a core holds except leases, load figures and undrained events, read straight
    from its objects (not through snapshot.py), in a form that compares with ==."""
    return {"last_epoch": core.last_epoch, "last_event_seq": core.events.last_seq,
            "executors": {eid: _executor_state(core, ex)
                          for eid, ex in sorted(core.executors.items())}}


def _executor_state(core: Allocator, ex) -> dict:
    pool = ex.pool
    blocks = pool.blocks
    return {
        "executor_id": ex.executor_id, "address": ex.address, "epoch": ex.epoch,
        "model_fingerprint": ex.model_fingerprint, "last_step_id": ex.last_step_id,
        "step_log": [(sid, rec.identity, rec.result) for sid, rec in ex.step_log.items()],
        "num_blocks": pool.num_blocks, "block_size": pool.block_size,
        "pool_fingerprint": pool.model_fingerprint, "num_free_blocks": pool.num_free_blocks,
        "block_views": block_views(pool),
        "blocks": [(b.block_id, b.ref_count, b.block_hash, b.parent_hash, b.token_ids,
                    b.node_id, b.parent_key) for b in blocks.blocks],
        "free_list": free_ids(pool),
        "hash_index": {h: (b.block_id, b.parent_hash, b.token_ids, b.node_id, b.parent_key)
                       for h, b in blocks.index_entries()},
        "last_node_id": blocks.last_node_id,
        "sequences": [(sid, seq.seq_id, seq.cache_salt, seq.block_ids(), seq.num_tokens,
                       list(seq.unhashed_token_ids), seq.num_cached_tokens, seq.num_computed_tokens, seq.num_hashed_blocks,
                       seq.chain_hash, seq.chain_key) for sid, seq in pool.sequences.items()],
        "prefix_counters": (pool.prefix_query_tokens, pool.prefix_hit_tokens),
        "hash_fn": blocks.hash_fn,
        "events_wired": (blocks.events is not None and blocks.events.log is core.events
                         and blocks.events.executor_id == ex.executor_id),
    }
