"""The blocks of one executor: reference counts, the free list and the prefix-cache index.

Mechanism only: it hands out and takes back blocks and keeps the hash index honest. Which
sequence gets which block, and when, is decided by `ExecutorPool` above it.
"""
from __future__ import annotations

from collections.abc import Iterable

from allocator_service.core.block import Block, BlockId
from allocator_service.core.block_hash import BlockHash, HashFn, PackedTokens, hash_packed
from allocator_service.core.free_block_queue import FreeBlockQueue
from allocator_service.core.hash_index import HashIndex
from allocator_service.core.kv_events import PoolEvents


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, hash_fn: HashFn = hash_packed) -> None:
        self.block_size = block_size
        self.hash_fn = hash_fn
        # Compiled, a call through a function object goes through its Python entry point;
        # hash() calls hash_packed directly unless a test put another function in its place.
        self._hashes_packed = hash_fn is hash_packed
        self.blocks = [Block(BlockId(i)) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.hash_index = HashIndex(self.blocks)
        # Node ids are never reused, so a stale identity can never match a new prefix.
        self.last_node_id = 0
        # Where index changes are reported (set by the allocator once the pool is registered).
        self.events: PoolEvents | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def hash(self, parent: BlockHash, tokens: PackedTokens) -> BlockHash:
        """A full block's hash: its parent's and its tokens' (block_hash.py)."""
        if self._hashes_packed:
            return hash_packed(parent, tokens)
        return self.hash_fn(parent, tokens)

    def take(self, count: int) -> list[Block]:
        """Takes `count` blocks from the head of the free list with ref_count 1.

        A taken block that still held a cached prefix is evicted now (lazy eviction). The caller
        has checked `num_free_blocks` first: asking for more is a bug.
        """
        assert count <= self.free_queue.num_free, "take() without checking num_free_blocks"
        taken = []
        for _ in range(count):
            block = self.free_queue.pop_head()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_count = 1
            taken.append(block)
        return taken

    def share(self, block: Block) -> None:
        """Adds a reference; a cached-free block leaves the free list (a prefix-cache hit)."""
        if block.ref_count == 0:
            self.free_queue.remove(block)
        block.ref_count += 1

    def release(self, blocks: list[Block]) -> None:
        """Drops one reference from each block, last block first.

        Blocks reaching zero go back to the free list: cached ones to the tail (kept for reuse,
        a sequence's first block freed last so a prefix outlives its continuation), the rest
        to the head (taken first).
        """
        # By index: compiled, reversed() is a generic iterator, 2 % of a fleet replay's CPU.
        for index in range(len(blocks) - 1, -1, -1):
            block = blocks[index]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} released below zero"
            if block.ref_count == 0:
                if block.block_hash is not None:
                    self.free_queue.push_tail(block)
                else:
                    self.free_queue.push_head(block)

    def lookup(self, block_hash: BlockHash, parent_node: int, salt: str,
               tokens: PackedTokens) -> Block | None:
        """The cached block holding exactly these tokens after exactly this prefix (node
        `parent_node`, or 0: the root of `salt`), if any."""
        block = self.hash_index.get(block_hash)
        if block is None or not block.has_parent(parent_node, salt) or block.tokens != tokens:
            return None
        return block

    def register(self, block: Block, block_hash: BlockHash, parent_hash: BlockHash,
                 parent_node: int, salt: str, tokens: PackedTokens) -> int:
        """Offers a full, computed block to the prefix cache; returns its prefix identity.

        If the same prefix is cached in another block already, that entry stays and its
        identity is returned. If a different, still reachable prefix owns the hash (a
        collision), the index is left alone and the chain gets a fresh identity that nothing
        else can match. An unreachable owner (its parent entry is gone) is replaced.
        """
        # One probe of the index: setdefault enters the block when the hash is free.
        existing = self.hash_index.setdefault(block_hash, block)
        if existing is block:
            if block.block_hash == block_hash:
                return block.node_id  # the block is this entry already (a shared block)
        else:
            if existing.has_parent(parent_node, salt) and existing.tokens == tokens:
                return existing.node_id
            if self._reachable(existing):
                return self._new_node_id()
            # An entry whose prefix was evicted (or reset) can never be hit again: it only
            # blocks the hash. Give the hash to the prefix that is being computed now.
            self.hash_index[block_hash] = block
            if self.events is not None:
                self.events.removed(existing)
            existing.forget_prefix()
        block.block_hash = block_hash
        block.parent_hash = parent_hash
        block.tokens = tokens
        block.set_parent(parent_node, salt)
        block.node_id = self._new_node_id()
        if self.events is not None:
            self.events.stored(block)
        return block.node_id

    def reset_prefix_cache(self) -> int:
        """Forgets every cached prefix; blocks in use keep their K/V, they just stop matching."""
        dropped = len(self.hash_index)
        for block in self.hash_index.values():
            block.forget_prefix()
        self.hash_index.clear()
        return dropped

    def free_list(self) -> Iterable[Block]:
        return iter(self.free_queue)

    def _reachable(self, block: Block) -> bool:
        """Whether a lookup from a root can still arrive at this entry: every ancestor entry is
        still in the index under the identity the entry was chained onto."""
        while block.parent_node:
            assert block.parent_hash is not None
            parent = self.hash_index.get(block.parent_hash)
            if parent is None or parent.node_id != block.parent_node:
                return False
            block = parent
        return True

    def _evict(self, block: Block) -> None:
        assert block.block_hash is not None
        # Once a fleet's pools have cycled through their free lists, every block taken is
        # evicted: one probe finds its entry, if the entry is this block's (else left alone).
        if self.hash_index.remove_entry(block.block_hash, block):
            if self.events is not None:
                self.events.removed(block)
        block.forget_prefix()

    def _new_node_id(self) -> int:
        self.last_node_id += 1
        return self.last_node_id
