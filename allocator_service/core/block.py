"""One physical KV-cache block: its record in its pool's arrays, and a view of it for readers.

A pool keeps its blocks in flat arrays (librt vecs, block_pool.py), not one object per block:

    records  vec[i64], RECORD items a block:  [ref, prev, next, hash lo, hash hi, node, parent node, -]
    parents  vec[i64], 2 a block:             the parent prefix's hash (lo, hi)
    tokens   vec[i32], block_size a block:    the tokens the cached K/V was computed from
    salts    list[str], 1 a block:            the salt of a chain's first block

At fleet scale a pool's blocks are touched in memory long gone cold: every block's life evicts
an old prefix and enters a new one tens of seconds after the block was last seen. As objects,
each block was a Block of two cache lines plus a bytes object for its hash, one for its tokens
and a reference to its parent's hash, each freed from cold memory when the prefix was evicted
(2026-11-28, 128 executors: `forget_prefix` 4.8 % of the allocator's CPU, `pymalloc_free`
3.8 %). A record is one cache line's worth of plain integers, written and read by compiled
loads and stores, and nothing is allocated or freed in a block's life.

Readers (audit, inspection, snapshots, tests) see a block through a `Block` view
(block_pool.py), made on demand; the Step path never makes one.
"""
from __future__ import annotations

from typing import Final, NewType

from mypy_extensions import i64

BlockId = NewType("BlockId", int)

# Identity of a cached prefix: the salt string for "no block yet" (the root of a tenant's chain),
# then a node id that is unique for the allocator's lifetime (from 1). Comparing identities
# instead of hashes makes a prefix hit exact even when two different prefixes collide on their
# hash. The core keeps one as a node id with 0 for the root, beside the salt it already has;
# PrefixKey is the one-value form its readers see.
PrefixKey = int | str

# A block's record: items of `records` from block_id * RECORD on.
REF: Final[i64] = 0          # sequences whose block table holds the block; 0: on the free list
PREV: Final[i64] = 1         # free-list links (block ids, the list's ends as sentinels); NOT_LINKED
NEXT: Final[i64] = 2         # while the block is in use
HASH_LO: Final[i64] = 3      # the cached prefix's hash, its 16 bytes as two little-endian ints
HASH_HI: Final[i64] = 4
NODE: Final[i64] = 5         # the cached prefix's node id; 0 when the block caches nothing
PARENT_NODE: Final[i64] = 6  # the node id of the prefix before it; 0: its salt's root
RECORD: Final[i64] = 8       # items a record (one is spare: 64 bytes, a cache line's worth)
NOT_LINKED: Final[i64] = -1


def split_prefix_key(key: PrefixKey) -> int:
    """The node id of a prefix key, 0 for a salt's root (snapshots store the one-value form)."""
    return key if isinstance(key, int) else 0
