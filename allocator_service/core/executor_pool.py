"""One executor's KV cache as the allocator manages it: sequences, block tables, prefix reuse.

Every action has a question beside it (`can_allocate` / `allocate`, `can_append` / `append`):
the question never mutates, and the action returns None instead of raising when blocks run out,
leaving the pool exactly as it was. Caller bugs (unknown or duplicate sequence ids) raise.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence as Seq
from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from allocator_service.core.block_hash import (BlockHash, HashFn, PackedTokens, hash_packed,
                                               packed_slice, root_hash)
from allocator_service.core.block_pool import BlockPool
from allocator_service.core.hash_index import ABSENT
from allocator_service.core.errors import SequenceExists, UnknownSequence
from allocator_service.core.sequence import Sequence
from pagedserve.common.errors import ResourceExhausted
from pagedserve.protocol.block_ops import SeqId
from pagedserve.protocol.token_bytes import TOKEN_BYTES


class PromptTooLarge(ResourceExhausted):
    """The sequence needs more blocks than the whole pool has: it can never be admitted."""


def blocks_for(num_slots: int, block_size: int) -> int:
    return -(-num_slots // block_size)


# Salts whose root hash a pool remembers; past this many it forgets them all and starts over
# (tenants are few; a flood of one-off salts must not grow memory).
MAX_REMEMBERED_ROOTS: Final = 1024


class Growth:
    """What an Append changed in the block table. Defined in the core, not beside the ops in
    pagedserve/protocol, so that the compiled core builds one without running Python code: a
    plain class, because mypyc compiles a dataclass's __init__ as interpreted Python (a frozen
    one paid about 2 % of a fleet replay's Step path building these)."""

    __slots__ = ("new_blocks", "copies")

    def __init__(self, new_blocks: list[int], copies: list[tuple[int, int]]) -> None:
        self.new_blocks = new_blocks
        # (src, dst): copy src's K/V into dst before computing; dst replaced src in the table.
        self.copies = copies

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Growth) and self.new_blocks == other.new_blocks
                and self.copies == other.copies)

    def __repr__(self) -> str:
        return f"Growth(new_blocks={self.new_blocks!r}, copies={self.copies!r})"


# An Append that needed no new block and no copy (most decode steps). Shared, never mutated.
NO_GROWTH: Final = Growth([], [])


class Allocation:
    """What an Allocate made: the new sequence's block table and how many of its prompt tokens
    were served from the prefix cache. A plain class for the reason Growth is one."""

    __slots__ = ("block_table", "num_cached_tokens")

    def __init__(self, block_table: list[int], num_cached_tokens: int) -> None:
        self.block_table = block_table
        self.num_cached_tokens = num_cached_tokens

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Allocation) and self.block_table == other.block_table
                and self.num_cached_tokens == other.num_cached_tokens)

    def __repr__(self) -> str:
        return (f"Allocation(block_table={self.block_table!r}, "
                f"num_cached_tokens={self.num_cached_tokens!r})")


class ExecutorPool:
    def __init__(self, num_blocks: int, block_size: int, model_fingerprint: str,
                 hash_fn: HashFn = hash_packed) -> None:
        self.block_size = block_size
        self.model_fingerprint = model_fingerprint
        self.blocks = BlockPool(num_blocks, block_size, hash_fn)
        self.sequences: dict[SeqId, Sequence] = {}
        # Each salt's root hash, computed once (it hashes the model fingerprint and the salt).
        self._root_hashes: dict[str, BlockHash] = {}
        # Prompt tokens looked up in / served from the prefix cache, over successful allocations.
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        return self.blocks.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    # -- prefix lookup ---------------------------------------------------------------------

    def _match_prefix(self, token_ids: array[int], cache_salt: str
                      ) -> tuple[vec[i32], BlockHash, i64]:
        """Cached blocks that hold the longest prefix of the prompt, and the chain after them.

        The block holding the prompt's last token is never taken from the cache: the executor
        must compute that token to get the logits of the first output token.
        """
        size = self.block_size
        chain_hash_ = self.root_hash(cache_salt)
        chain_node: i64 = 0   # the salt's root
        hits = vec[i32]()
        blocks = self.blocks
        for start in range(0, (len(token_ids) - 1) // size * size, size):
            block_tokens = packed_slice(token_ids, start, start + size)
            block_hash = blocks.hash(chain_hash_, block_tokens)
            block = blocks.lookup(block_hash, chain_node, cache_salt, block_tokens)
            if block == ABSENT:
                break
            hits = append(hits, i32(block))
            chain_hash_, chain_node = block_hash, blocks.node_of(block)
        return hits, chain_hash_, chain_node

    def root_hash(self, cache_salt: str) -> BlockHash:
        """The hash a chain of this salt starts from (the parent hash of its first block)."""
        root = self._root_hashes.get(cache_salt)
        if root is None:
            if len(self._root_hashes) >= MAX_REMEMBERED_ROOTS:
                self._root_hashes.clear()
            root = self._root_hashes[cache_salt] = root_hash(self.model_fingerprint, cache_salt)
        return root

    def num_cached_prefix_tokens(self, token_ids: Seq[int], cache_salt: str) -> int:
        """Prompt tokens an Allocate would find cached right now (no state changes)."""
        return len(self._match_prefix(array("i", token_ids), cache_salt)[0]) * self.block_size

    # -- allocate ----------------------------------------------------------------------------

    def _allocation_cost(self, token_ids: Seq[int], lookahead_slots: int,
                         hits: vec[i32]) -> tuple[int, int]:
        """(new blocks to take, free blocks consumed): hits on cached-free blocks use free ones."""
        needed = blocks_for(len(token_ids) + lookahead_slots, self.block_size)
        if needed > self.num_blocks:
            raise PromptTooLarge(
                f"{len(token_ids)} tokens (+{lookahead_slots} reserved) need {needed} blocks of "
                f"{self.block_size} slots but the pool has only {self.num_blocks}")
        new = needed - len(hits)
        blocks = self.blocks
        return new, new + sum(1 for block in hits if blocks.ref_count(i64(block)) == 0)

    def can_allocate(self, token_ids: Seq[int], cache_salt: str = "",
                     lookahead_slots: int = 0) -> bool:
        hits, _, _ = self._match_prefix(array("i", token_ids), cache_salt)
        return self._allocation_cost(token_ids, lookahead_slots, hits)[1] <= self.num_free_blocks

    def allocate(self, seq_id: SeqId, token_ids: Seq[int], cache_salt: str = "",
                 lookahead_slots: int = 0) -> Allocation | None:
        """Creates the sequence with blocks for its prompt, reusing cached prefix blocks.

        Returns None (and changes nothing) when too few blocks are free.
        """
        if seq_id in self.sequences:
            raise SequenceExists(seq_id)
        tokens = array("i", token_ids)
        hits, chain_hash_, chain_node = self._match_prefix(tokens, cache_salt)
        new, consumed = self._allocation_cost(token_ids, lookahead_slots, hits)
        if consumed > self.num_free_blocks:
            return None
        blocks = self.blocks
        for block in hits:  # before take(): a hit block must not be evicted by our own take
            blocks.share(i64(block))
        table = hits
        for _ in range(new):
            table = append(table, i32(blocks.take()))
        num_cached = len(hits) * self.block_size
        del tokens[:num_cached]  # the hits' tokens are in their hashes
        self.sequences[seq_id] = Sequence(
            seq_id=seq_id, cache_salt=cache_salt, block_table=table,
            num_tokens=len(token_ids), unhashed_token_ids=tokens, num_cached_tokens=num_cached,
            num_computed_tokens=num_cached, num_hashed_blocks=len(hits), chain_hash=chain_hash_,
            chain_node=chain_node)
        self.prefix_query_tokens += len(token_ids)
        self.prefix_hit_tokens += num_cached
        return Allocation([int(block) for block in table], num_cached)

    # -- append ------------------------------------------------------------------------------
    #
    #   block_size 4, 6 tokens, lookahead 3, then append 2 tokens:
    #
    #   before  [t t t t][t t . .]                 first written slot: token 6, block 1
    #   after   [t t t t][t t t t][. . . .]        capacity for 6 + 2 + 3 = 11 slots → 3 blocks
    #
    #   If block 1 is shared (refcount > 1, after a fork), the writer gets a fresh block in its
    #   place and a (old, new) copy instruction; the other holders keep the old block.

    def _append_cost(self, seq: Sequence, num_new_tokens: int,
                     lookahead_slots: int) -> tuple[int, bool]:
        """(blocks to add at the end, whether the first written block must be copied first)."""
        table, size = seq.block_table, self.block_size
        num_tokens = seq.num_tokens
        grow = -(-(num_tokens + num_new_tokens + lookahead_slots) // size) - len(table)
        first_written = num_tokens // size
        copy = (num_new_tokens > 0 and first_written < len(table)
                and self.blocks.ref_count(i64(table[first_written])) > 1)
        return max(0, grow), copy

    def can_append(self, seq_id: SeqId, num_new_tokens: int, lookahead_slots: int = 0) -> bool:
        grow, copy = self._append_cost(self._get(seq_id), num_new_tokens, lookahead_slots)
        return grow + copy <= self.num_free_blocks

    def append(self, seq_id: SeqId, token_ids: Seq[int] = (), lookahead_slots: int = 0,
               num_computed_tokens: int = 0) -> Growth | None:
        """Adds tokens, reserves slots ahead, copies a shared block before it is written, and
        offers blocks that are full and computed to the prefix cache.

        Returns NO_GROWTH when the table did not change, None (changing nothing) when too few
        blocks are free. This is the decode hot path: one call per running sequence per step.
        """
        seq = self.sequences.get(seq_id)
        if seq is None:
            raise UnknownSequence(seq_id)
        grow, copy = self._append_cost(seq, len(token_ids), lookahead_slots)
        growth: Growth | None = NO_GROWTH
        if grow or copy:
            growth = self._grow(seq, grow, copy)
            if growth is None:
                return None
        if token_ids:
            # Packed ids arrive as an int32 array: one copy into a short array.
            seq.unhashed_token_ids.extend(token_ids)
            seq.num_tokens += len(token_ids)
        if num_computed_tokens > seq.num_computed_tokens:
            seq.num_computed_tokens = min(num_computed_tokens, seq.num_tokens)
            if seq.num_computed_tokens // self.block_size > seq.num_hashed_blocks:
                self._cache_computed_blocks(seq)
        return growth

    def _grow(self, seq: Sequence, grow: int, copy: bool) -> Growth | None:
        if grow + copy > self.num_free_blocks:
            return None
        copies: list[tuple[int, int]] = []
        blocks = self.blocks
        if copy:
            index = seq.num_tokens // self.block_size
            shared = seq.block_table[index]
            private = blocks.take()
            blocks.release_one(i64(shared))
            seq.block_table[index] = i32(private)
            copies.append((int(shared), int(private)))
        new_blocks: list[int] = []
        table = seq.block_table
        for _ in range(grow):
            block = blocks.take()
            table = append(table, i32(block))
            new_blocks.append(int(block))
        seq.block_table = table
        return Growth(new_blocks, copies)

    def _cache_computed_blocks(self, seq: Sequence) -> None:
        """Hashes every full block below the computed mark, in order, into the prefix cache."""
        size = self.block_size
        first, end = seq.num_hashed_blocks, seq.num_computed_tokens // size
        if end <= first:
            return
        blocks, table = self.blocks, seq.block_table
        # The new full blocks' tokens cut from the array once, then per block as bytes: an
        # Append at --reserve-blocks R fills about R blocks, and cutting each from the array
        # made an array object and a bytes object per block. The array starts at block `first`.
        unhashed = seq.unhashed_token_ids
        packed = packed_slice(unhashed, 0, (end - first) * size)
        width = size * TOKEN_BYTES
        chain_hash_, chain_node, salt = seq.chain_hash, seq.chain_node, seq.cache_salt
        for index in range(first, end):
            offset = (index - first) * width
            # A slice of the whole of `packed` (one block) is `packed` itself, not a copy.
            block_tokens = PackedTokens(packed[offset:offset + width])
            block_hash = blocks.hash(chain_hash_, block_tokens)
            chain_node = blocks.register(i64(table[index]), block_hash, chain_hash_, chain_node,
                                         salt, block_tokens)
            chain_hash_ = block_hash
        seq.chain_hash, seq.chain_node, seq.num_hashed_blocks = chain_hash_, chain_node, end
        del unhashed[:(end - first) * size]

    # -- fork and free -----------------------------------------------------------------------

    def fork(self, parent_id: SeqId, child_id: SeqId) -> list[int]:
        """Creates `child_id` sharing every block that holds a token of the parent (refcount +1).

        Blocks the parent reserved ahead stay the parent's alone. Needs no free block, so it
        cannot run out; the first write into the shared tail copies it (see `append`).
        """
        parent = self._get(parent_id)
        if child_id in self.sequences:
            raise SequenceExists(child_id)
        shared = parent.block_table[:blocks_for(parent.num_tokens, self.block_size)]
        for block in shared:
            self.blocks.share(i64(block))
        self.sequences[child_id] = Sequence(
            seq_id=child_id, cache_salt=parent.cache_salt, block_table=shared,
            num_tokens=parent.num_tokens,
            unhashed_token_ids=array("i", parent.unhashed_token_ids),
            num_cached_tokens=parent.num_cached_tokens,
            num_computed_tokens=parent.num_computed_tokens,
            num_hashed_blocks=parent.num_hashed_blocks, chain_hash=parent.chain_hash,
            chain_node=parent.chain_node)
        return [int(block) for block in shared]

    def free(self, seq_id: SeqId) -> None:
        """Ends the sequence; blocks nobody else holds return to the free list."""
        seq = self._get(seq_id)
        del self.sequences[seq_id]  # compiled, a direct call where pop() is a method lookup
        self.blocks.release(seq.block_table)

    def reset_prefix_cache(self) -> int:
        """Drops every cache entry. Live sequences keep hashing what they compute next: their
        chain identities belong to dropped entries, so nothing cached later can match them."""
        return self.blocks.reset_prefix_cache()

    def _get(self, seq_id: SeqId) -> Sequence:
        seq = self.sequences.get(seq_id)
        if seq is None:
            raise UnknownSequence(seq_id)
        return seq
