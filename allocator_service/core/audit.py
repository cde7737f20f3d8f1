"""Every invariant of a pool, checked from scratch; an empty list means healthy.

Used by the Audit RPC, by the stateful tests after every step, and after fault tests to prove
that no block leaked.
"""
from __future__ import annotations

from collections import Counter

from allocator_service.core.block_hash import BlockHash, packed_slice
from allocator_service.core.executor_pool import ExecutorPool
from allocator_service.core.sequence import Sequence
from pagedserve.protocol.token_bytes import TOKEN_BYTES


def audit_pool(executor_id: str, pool: ExecutorPool) -> list[str]:
    where = f"pool {executor_id!r}"
    violations: list[str] = []
    size = pool.block_size

    references: Counter[int] = Counter()
    for seq in pool.sequences.values():
        ids = seq.block_ids()
        references.update(ids)
        if len(set(ids)) != len(ids):
            violations.append(f"{where}: sequence {seq.seq_id!r} holds a block twice: {ids}")
        if len(seq.block_table) * size < seq.num_tokens:
            violations.append(f"{where}: sequence {seq.seq_id!r} has {seq.num_tokens} tokens "
                              f"but only {len(seq.block_table)} blocks of {size}")
        if not seq.num_hashed_blocks * size <= seq.num_computed_tokens <= seq.num_tokens:
            violations.append(
                f"{where}: sequence {seq.seq_id!r} has hashed {seq.num_hashed_blocks} blocks, "
                f"computed {seq.num_computed_tokens} of {seq.num_tokens} tokens")

    free_ids = pool.blocks.free_block_ids()
    if len(free_ids) != pool.num_free_blocks:
        violations.append(f"{where}: free list holds {len(free_ids)} blocks but counts "
                          f"{pool.num_free_blocks}")
    if len(set(free_ids)) != len(free_ids):
        violations.append(f"{where}: a block is on the free list twice")
    free_set = set(free_ids)

    # Labels are written only for a violation: a healthy pool of 24,576 blocks would spend
    # a third of its audit formatting them.
    for block in pool.blocks.blocks:
        on_free_list = block.block_id in free_set
        if on_free_list == (block.ref_count > 0):
            violations.append(f"{where}: block {block.block_id} has ref_count "
                              f"{block.ref_count} and is "
                              f"{'' if on_free_list else 'not '}on the free list")
        if pool.blocks.free_queue.contains(block.block_id) != on_free_list:
            violations.append(f"{where}: block {block.block_id} has free-list links that "
                              "disagree with the list")
        if block.ref_count != references[block.block_id]:
            violations.append(f"{where}: block {block.block_id} has ref_count "
                              f"{block.ref_count} but {references[block.block_id]} "
                              "block-table references")

    used = sum(1 for block in pool.blocks.blocks if block.ref_count > 0)
    if used + len(free_ids) != pool.num_blocks:
        violations.append(f"{where}: {used} used + {len(free_ids)} free != "
                          f"{pool.num_blocks} blocks")

    violations += _audit_hash_index(where, pool)
    return violations


def _audit_hash_index(where: str, pool: ExecutorPool) -> list[str]:
    violations = []
    size = pool.block_size
    for block_hash, block_id in pool.blocks.hash_index.items():
        block = pool.blocks.block(block_id)
        if block.block_hash != block_hash or block.tokens is None or block.parent_hash is None:
            violations.append(f"{_entry(where, block_hash, block_id)} does not carry that hash")
            continue
        if len(block.tokens) != size * TOKEN_BYTES:
            violations.append(f"{_entry(where, block_hash, block_id)} stores "
                              f"{len(block.tokens) / TOKEN_BYTES:g} tokens, not {size}")
        if pool.blocks.hash_fn(block.parent_hash, block.tokens) != block_hash:
            violations.append(f"{_entry(where, block_hash, block_id)}: its stored tokens hash "
                              "to something else")
    for block in pool.blocks.blocks:
        if (block.block_hash is not None
                and pool.blocks.hash_index.get(block.block_hash) != block.block_id):
            violations.append(f"{where}: block {block.block_id} carries a hash the index does "
                              "not map to it")
    for seq in pool.sequences.values():
        violations += _audit_sequence_tokens(where, pool, seq)
    return violations


def _entry(where: str, block_hash: BlockHash, block_id: int) -> str:
    """How a violation names a cache entry (written only for one)."""
    return f"{where}: hash {block_hash.hex()} -> block {block_id}"


def _audit_sequence_tokens(where: str, pool: ExecutorPool, seq: Sequence) -> list[str]:
    """A sequence's blocks hold its tokens. It keeps no tokens of the blocks it hashed, so those
    are tied to it by the hash chain: while every hashed block is still a cache entry, chained
    one onto the last, the chain must end at the sequence's chain hash (a block holding other
    tokens would hash elsewhere). A block that left the cache (a reset, a duplicate, a
    collision) ends what can be checked. Blocks after the hashed ones are compared with the
    tokens the sequence keeps."""
    label = f"{where}: sequence {seq.seq_id!r}"
    size = pool.block_size
    hashed = seq.num_hashed_blocks * size
    violations = []
    if len(seq.unhashed_token_ids) != seq.num_tokens - hashed:
        violations.append(f"{label} keeps {len(seq.unhashed_token_ids)} unhashed tokens, not "
                          f"{seq.num_tokens} - {hashed}")
    chain: BlockHash | None = pool.root_hash(seq.cache_salt)
    for block_id in seq.block_table[:seq.num_hashed_blocks]:
        block = pool.blocks.block(block_id)
        if block.block_hash is None or block.parent_hash != chain:
            chain = None
            break
        chain = block.block_hash
    if chain is not None and chain != seq.chain_hash:
        violations.append(f"{label}: its cached blocks chain to hash {chain.hex()}, but it "
                          f"continues from {seq.chain_hash.hex()}")
    for index in range(seq.num_hashed_blocks, len(seq.block_table)):
        block = pool.blocks.block(seq.block_table[index])
        start = index * size - hashed
        if block.tokens is not None and (
                packed_slice(seq.unhashed_token_ids, start, start + size) != block.tokens):
            violations.append(f"{label} holds cached block {block.block_id} at position "
                              f"{index} with other tokens")
    return violations
