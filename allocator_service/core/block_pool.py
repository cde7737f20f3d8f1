"""The blocks of one executor: reference counts, the free list and the prefix-cache index.

Mechanism only: it hands out and takes back blocks and keeps the hash index honest. Which
sequence gets which block, and when, is decided by `ExecutorPool` above it. The blocks live in
flat arrays (their layout: block.py); the Step path passes block ids, and readers get `Block`
views (`block()`, `blocks`).
"""
from __future__ import annotations

from collections.abc import Iterable

from librt.strings import BytesWriter, read_i32_le, write_i32_le
from librt.vecs import vec
from mypy_extensions import i32, i64

from allocator_service.core.block import (HASH_HI, HASH_LO, NEXT, NODE, NOT_LINKED,
                                          PARENT_NODE, PREV, RECORD, REF, BlockId, PrefixKey,
                                          split_prefix_key)
from allocator_service.core.block_hash import (BlockHash, HashFn, PackedTokens, hash_packed,
                                               unpack_tokens)
from allocator_service.core.free_block_queue import FreeBlockQueue
from allocator_service.core.hash_index import ABSENT, HashIndex, hash_bytes, hash_hi, hash_lo
from allocator_service.core.kv_events import PoolEvents
from pagedserve.protocol.token_bytes import TOKEN_BYTES


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, hash_fn: HashFn = hash_packed) -> None:
        self.block_size = block_size
        self.hash_fn = hash_fn
        # Compiled, a call through a function object goes through its Python entry point;
        # hash() calls hash_packed directly unless a test put another function in its place.
        self._hashes_packed = hash_fn is hash_packed
        self._num_blocks: i64 = num_blocks
        # Every block's record, then the free list's two sentinels (block.py).
        records = vec[i64]([0] * ((num_blocks + 2) * RECORD))
        for at in range(0, (num_blocks + 2) * RECORD, RECORD):
            records[at + PREV] = records[at + NEXT] = NOT_LINKED
        self._records = records
        self._parent_hashes = vec[i64]([0] * (2 * num_blocks))
        self._tokens = vec[i32]([0] * (num_blocks * block_size))
        # A chain's first block's salt ("" for every other block, and once evicted): its parent
        # prefix is that salt's root.
        self._salts: list[str] = [""] * num_blocks
        self.free_queue = FreeBlockQueue(self._records, num_blocks, range(num_blocks))
        self.hash_index = HashIndex(num_blocks)
        # Node ids are never reused, so a stale identity can never match a new prefix.
        self.last_node_id = 0
        # Where index changes are reported (set by the allocator once the pool is registered).
        self.events: PoolEvents | None = None

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def hash(self, parent: BlockHash, tokens: PackedTokens) -> BlockHash:
        """A full block's hash: its parent's and its tokens' (block_hash.py)."""
        if self._hashes_packed:
            return hash_packed(parent, tokens)
        return self.hash_fn(parent, tokens)

    # -- the Step path: block ids ------------------------------------------------------------

    def take(self) -> i64:
        """Takes the block at the head of the free list, with ref_count 1.

        A taken block that still held a cached prefix is evicted now (lazy eviction). The caller
        has checked `num_free_blocks` first: asking for more is a bug.
        """
        block = self.free_queue.pop_head()
        at = block * RECORD
        if self._records[at + NODE] != 0:
            self._evict(block)
        self._records[at + REF] = 1
        return block

    def share(self, block: i64) -> None:
        """Adds a reference; a cached-free block leaves the free list (a prefix-cache hit)."""
        at = block * RECORD
        if self._records[at + REF] == 0:
            self.free_queue.remove(block)
        self._records[at + REF] += 1

    def release(self, blocks: vec[i32]) -> None:
        """Drops one reference from each block, last block first.

        Blocks reaching zero go back to the free list: cached ones to the tail (kept for reuse,
        a sequence's first block freed last so a prefix outlives its continuation), the rest
        to the head (taken first).
        """
        for index in range(len(blocks) - 1, -1, -1):
            self.release_one(i64(blocks[index]))

    def release_one(self, block: i64) -> None:
        records = self._records
        at = block * RECORD
        count = records[at + REF] - 1
        assert count >= 0, f"block {block} released below zero"
        records[at + REF] = count
        if count == 0:
            if records[at + NODE] != 0:
                self.free_queue.push_tail(block)
            else:
                self.free_queue.push_head(block)

    def ref_count(self, block: i64) -> i64:
        return self._records[block * RECORD + REF]

    def node_of(self, block: i64) -> i64:
        """The node id of the prefix cached in this block; 0 when it caches none."""
        return self._records[block * RECORD + NODE]

    def lookup(self, block_hash: BlockHash, parent_node: i64, salt: str,
               tokens: PackedTokens) -> i64:
        """The cached block holding exactly these tokens after exactly this prefix (node
        `parent_node`, or 0: the root of `salt`), or ABSENT."""
        block = self.hash_index.find(hash_lo(block_hash), hash_hi(block_hash))
        if block == ABSENT or not self._has_parent(block, parent_node, salt) \
                or not self._holds(block, tokens):
            return ABSENT
        return block

    def register(self, block: i64, block_hash: BlockHash, parent_hash: BlockHash,
                 parent_node: i64, salt: str, tokens: PackedTokens) -> i64:
        """Offers a full, computed block to the prefix cache; returns its prefix identity.

        If the same prefix is cached in another block already, that entry stays and its
        identity is returned. If a different, still reachable prefix owns the hash (a
        collision), the index is left alone and the chain gets a fresh identity that nothing
        else can match. An unreachable owner (its parent entry is gone) is replaced.
        """
        records = self._records
        lo, hi = hash_lo(block_hash), hash_hi(block_hash)
        at = block * RECORD
        # One probe of the index: the block is entered when the hash is free.
        existing = self.hash_index.enter(lo, hi, block)
        if existing == block:
            if records[at + NODE] != 0 and records[at + HASH_LO] == lo \
                    and records[at + HASH_HI] == hi:
                return records[at + NODE]  # the block is this entry already (a shared block)
        else:
            if self._has_parent(existing, parent_node, salt) and self._holds(existing, tokens):
                return records[existing * RECORD + NODE]
            if self._reachable(existing):
                return self._new_node_id()
            # An entry whose prefix was evicted (or reset) can never be hit again: it only
            # blocks the hash. Give the hash to the prefix that is being computed now.
            self.hash_index.replace(lo, hi, block)
            if self.events is not None:
                self.events.removed(existing, lo, hi)
            self._forget(existing)
        node = self._new_node_id()
        self._write_entry(block, lo, hi, parent_hash, tokens, parent_node, salt, node)
        if self.events is not None:
            self.events.stored(block, block_hash, parent_hash, tokens)
        return node

    def reset_prefix_cache(self) -> int:
        """Forgets every cached prefix; blocks in use keep their K/V, they just stop matching."""
        dropped = len(self.hash_index)
        for block in self.hash_index.values():
            self._forget(block)
        self.hash_index.clear()
        return dropped

    # -- inside ----------------------------------------------------------------------------------

    def _write_entry(self, block: i64, lo: i64, hi: i64, parent_hash: BlockHash,
                     tokens: PackedTokens, parent_node: i64, salt: str, node: i64) -> None:
        """Writes a cached prefix into the block's record and arrays (the index is the
        caller's): node `node`, hash (lo, hi), after node `parent_node` or (0) salt's root."""
        records, at = self._records, block * RECORD
        records[at + HASH_LO] = lo
        records[at + HASH_HI] = hi
        self._parent_hashes[2 * block] = hash_lo(parent_hash)
        self._parent_hashes[2 * block + 1] = hash_hi(parent_hash)
        self._store_tokens(block, tokens)
        records[at + PARENT_NODE] = parent_node
        if parent_node == 0:
            self._salts[block] = salt
        records[at + NODE] = node

    def _has_parent(self, block: i64, parent_node: i64, salt: str) -> bool:
        """Whether the prefix before this block is node `parent_node`, or (0) salt's root."""
        return self._records[block * RECORD + PARENT_NODE] == parent_node and (
            parent_node != 0 or self._salts[block] == salt)

    def _holds(self, block: i64, tokens: PackedTokens) -> bool:
        """Whether the block's cached tokens are `tokens` (packed)."""
        size: i64 = self.block_size
        width: i64 = TOKEN_BYTES  # once: a name of another module is a dict lookup per use
        if len(tokens) != size * width:
            return False
        stored, base = self._tokens, block * size
        for index in range(size):
            if stored[base + index] != read_i32_le(tokens, index * width):
                return False
        return True

    def _store_tokens(self, block: i64, tokens: PackedTokens) -> None:
        size: i64 = self.block_size
        width: i64 = TOKEN_BYTES
        assert len(tokens) == size * width, f"block {block}: {len(tokens)} token bytes"
        stored, base = self._tokens, block * size
        for index in range(size):
            stored[base + index] = read_i32_le(tokens, index * width)

    def _reachable(self, block: i64) -> bool:
        """Whether a lookup from a root can still arrive at this entry: every ancestor entry is
        still in the index under the identity the entry was chained onto."""
        records, parents = self._records, self._parent_hashes
        parent_node = records[block * RECORD + PARENT_NODE]
        while parent_node != 0:
            parent = self.hash_index.find(parents[2 * block], parents[2 * block + 1])
            if parent == ABSENT or records[parent * RECORD + NODE] != parent_node:
                return False
            block = parent
            parent_node = records[block * RECORD + PARENT_NODE]
        return True

    def _evict(self, block: i64) -> None:
        # Once a fleet's pools have cycled through their free lists, every block taken is
        # evicted: one probe finds its entry, if the entry is this block's (else left alone).
        at = block * RECORD
        lo, hi = self._records[at + HASH_LO], self._records[at + HASH_HI]
        if self.hash_index.remove_entry(lo, hi, block):
            if self.events is not None:
                self.events.removed(block, lo, hi)
        self._forget(block)

    def _forget(self, block: i64) -> None:
        """The block caches no prefix any more (its hash and tokens are left, unread)."""
        at = block * RECORD
        if self._records[at + PARENT_NODE] == 0:
            self._salts[block] = ""
        self._records[at + NODE] = 0
        self._records[at + PARENT_NODE] = 0

    def _new_node_id(self) -> i64:
        self.last_node_id += 1
        return self.last_node_id

    # -- readers: audit, inspection, snapshots, tests ---------------------------------------------

    def block(self, block_id: int) -> Block:
        return Block(self, BlockId(block_id))

    @property
    def blocks(self) -> list[Block]:
        """A view of every block, in id order."""
        return [Block(self, BlockId(block_id)) for block_id in range(self._num_blocks)]

    def index_entries(self) -> list[tuple[BlockHash, Block]]:
        """The prefix-cache index as (hash, block) pairs, in the table's order."""
        return [(block_hash, Block(self, BlockId(block)))
                for block_hash, block in self.hash_index.items()]

    def saved_blocks(self) -> list[tuple[int, int, bytes, bytes, bytes, int, PrefixKey]]:
        """Every block in use or caching a prefix, as snapshots keep it: (id, ref_count, hash,
        parent hash, tokens, node id, parent key), the last five b"" / 0 / "" for a block that
        caches nothing. Read here, compiled, rather than through a view per block: a snapshot
        reads every block of every pool (590,000 for 24 fleet pools)."""
        saved: list[tuple[int, int, bytes, bytes, bytes, int, PrefixKey]] = []
        records = self._records
        for block in range(self._num_blocks):
            at = block * RECORD
            ref, node = records[at + REF], records[at + NODE]
            if node != 0:
                saved.append((block, ref, self.hash_of(block), self.parent_hash_of(block),
                              self.tokens_of(block), node, self.parent_key_of(block)))
            elif ref != 0:
                saved.append((block, ref, b"", b"", b"", 0, ""))
        return saved

    def parent_key_of(self, block: int) -> PrefixKey:
        """The identity of the prefix before the block: its parent's node id, or the salt."""
        parent_node = self.parent_node_of(block)
        return parent_node if parent_node else self.root_salt_of(block)

    def usage(self) -> tuple[int, int, dict[int, int]]:
        """In one pass over the records: the blocks that have holders, the free blocks still
        caching a prefix, and how many blocks with holders have each ref count. For the admin's
        stats, which run under the state's lock: a view of every block took 41-60 ms a pool of
        24,576 blocks, about 5 s for a fleet of 128 pools."""
        records = self._records
        used: i64 = 0
        cached_free: i64 = 0
        histogram: dict[int, int] = {}
        for block in range(self._num_blocks):
            at = block * RECORD
            ref = records[at + REF]
            if ref > 0:
                used += 1
                histogram[int(ref)] = histogram.get(int(ref), 0) + 1
            elif records[at + NODE] != 0:
                cached_free += 1
        return int(used), int(cached_free), histogram

    def free_block_ids(self) -> list[int]:
        """The free list, head (taken first) to tail."""
        return self.free_queue.block_ids()

    def is_cached(self, block: int) -> bool:
        return self.node_of(block) != 0

    def hash_of(self, block: int) -> BlockHash:
        at = i64(block) * RECORD
        return hash_bytes(self._records[at + HASH_LO], self._records[at + HASH_HI])

    def parent_hash_of(self, block: int) -> BlockHash:
        return hash_bytes(self._parent_hashes[2 * i64(block)],
                          self._parent_hashes[2 * i64(block) + 1])

    def tokens_of(self, block: int) -> PackedTokens:
        size: i64 = self.block_size
        out, stored, base = BytesWriter(), self._tokens, i64(block) * size
        for index in range(size):
            write_i32_le(out, stored[base + index])
        return PackedTokens(out.getvalue())

    def parent_node_of(self, block: int) -> int:
        return self._records[i64(block) * RECORD + PARENT_NODE]

    def root_salt_of(self, block: int) -> str:
        return self._salts[block] if self.is_cached(block) and not self.parent_node_of(block) \
            else ""

    def set_ref_count(self, block: int, count: int) -> None:
        """Writes a reference count as it is, free list untouched (snapshots, tests)."""
        self._records[i64(block) * RECORD + REF] = count

    def set_tokens(self, block: int, tokens: PackedTokens) -> None:
        self._store_tokens(block, tokens)

    def announce_entries(self) -> None:
        """Reports every entry of the index as stored (a resync of the KV events' readers)."""
        if self.events is None:
            return
        for block_hash, block in self.hash_index.items():
            self.events.stored(block, block_hash, self.parent_hash_of(block),
                               self.tokens_of(block))

    def restore_entry(self, block: int, block_hash: BlockHash, parent_hash: BlockHash,
                      tokens: PackedTokens, node_id: int, parent_key: PrefixKey) -> None:
        """Makes the block the index's entry for a prefix, as a snapshot saved it."""
        lo, hi = hash_lo(block_hash), hash_hi(block_hash)
        salt = "" if isinstance(parent_key, int) else parent_key
        self._write_entry(block, lo, hi, parent_hash, tokens, split_prefix_key(parent_key), salt,
                          node_id)
        self.hash_index.replace(lo, hi, block)

    def restore_free_list(self, block_ids: Iterable[int]) -> None:
        """Links exactly these blocks, in this order, as the free list (snapshots)."""
        records = self._records
        for block in range(self._num_blocks + 2):
            records[block * RECORD + PREV] = records[block * RECORD + NEXT] = NOT_LINKED
        self.free_queue = FreeBlockQueue(records, self._num_blocks, block_ids)


class Block:
    """A view of block `block_id` of `pool`, for readers (audit, inspection, snapshots,
    tests): it reads and writes the block's record. Two views of one block are equal."""

    __slots__ = ("pool", "block_id")

    def __init__(self, pool: BlockPool, block_id: BlockId) -> None:
        self.pool = pool
        self.block_id = block_id

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Block) and self.pool is other.pool
                and self.block_id == other.block_id)

    def __hash__(self) -> int:
        return hash(self.block_id)

    def __repr__(self) -> str:
        return (f"Block({self.block_id}, ref_count={self.ref_count}, "
                f"node_id={self.node_id}, cached={self.is_cached})")

    @property
    def ref_count(self) -> int:
        return self.pool.ref_count(self.block_id)

    @ref_count.setter
    def ref_count(self, value: int) -> None:  # tests corrupt a pool to see the audit say so
        self.pool.set_ref_count(self.block_id, value)

    @property
    def is_cached(self) -> bool:
        return self.pool.is_cached(self.block_id)

    @property
    def block_hash(self) -> BlockHash | None:
        return self.pool.hash_of(self.block_id) if self.is_cached else None

    @property
    def parent_hash(self) -> BlockHash | None:
        return self.pool.parent_hash_of(self.block_id) if self.is_cached else None

    @property
    def tokens(self) -> PackedTokens | None:
        return self.pool.tokens_of(self.block_id) if self.is_cached else None

    @tokens.setter
    def tokens(self, tokens: PackedTokens) -> None:  # tests corrupt a pool (see ref_count)
        self.pool.set_tokens(self.block_id, tokens)

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """The cached tokens as ints, for readers (snapshots, audits, tests)."""
        tokens = self.tokens
        return None if tokens is None else unpack_tokens(tokens)

    @property
    def node_id(self) -> int:
        return self.pool.node_of(self.block_id)

    @property
    def parent_node(self) -> int:
        return self.pool.parent_node_of(self.block_id)

    @property
    def root_salt(self) -> str:
        return self.pool.root_salt_of(self.block_id)

    @property
    def parent_key(self) -> PrefixKey:
        """The identity of the prefix before this block: its parent's node id, or the salt."""
        return self.pool.parent_key_of(self.block_id)
