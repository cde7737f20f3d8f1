"""One physical KV-cache block as the allocator sees it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType

from allocator_service.core.block_hash import BlockHash, PackedTokens, unpack_tokens

BlockId = NewType("BlockId", int)

# Identity of a cached prefix: the salt string for "no block yet" (the root of a tenant's chain),
# then a node id that is unique for the allocator's lifetime (from 1). Comparing identities
# instead of hashes makes a prefix hit exact even when two different prefixes collide on their
# hash. The core keeps one as a node id (an int, unboxed when compiled) with 0 for the root,
# beside the salt it already has; PrefixKey is the one-value form its readers see.
PrefixKey = int | str


def split_prefix_key(key: PrefixKey) -> int:
    """The node id of a prefix key, 0 for a salt's root (snapshots store the one-value form)."""
    return key if isinstance(key, int) else 0


@dataclass(slots=True, eq=False)
class Block:
    block_id: BlockId
    # Sequences whose block table holds this block; 0 means it is on the free list.
    ref_count: int = 0

    # Prefix-cache entry, set only while the block is the hash index's entry for its content:
    block_hash: BlockHash | None = None
    # Hash of the previous block in the chain (the root hash for a first block).
    parent_hash: BlockHash | None = None
    # The exact tokens the K/V was computed from (packed, block_hash.py); compared on every
    # hit, so a hash collision can never serve K/V of other tokens.
    tokens: PackedTokens | None = None
    # Identity of the prefix ending in this block, and of the prefix before it: the parent
    # block's node id, or 0 for a chain's first block, whose parent is its salt's root
    # (`root_salt`). Two fields rather than one `int | str`: compiled, an int field is stored
    # unboxed, where a boxed node id was one more object per cached block, freed only when the
    # block was evicted, from memory long gone cold. `parent_key` gives them as one value.
    node_id: int = 0
    parent_node: int = 0
    root_salt: str = ""

    # Links of the free list (both None while the block is in use).
    prev_free: Block | None = field(default=None, repr=False)
    next_free: Block | None = field(default=None, repr=False)

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """The cached tokens as ints, for readers (snapshots, audits, tests)."""
        return None if self.tokens is None else unpack_tokens(self.tokens)

    @property
    def is_cached(self) -> bool:
        return self.block_hash is not None

    @property
    def parent_key(self) -> PrefixKey:
        """The identity of the prefix before this block: its parent's node id, or the salt."""
        return self.parent_node if self.parent_node else self.root_salt

    def set_parent(self, parent_node: int, salt: str) -> None:
        """The prefix before this block: node `parent_node`, or (0) the root of `salt`."""
        self.parent_node = parent_node
        self.root_salt = "" if parent_node else salt

    def set_parent_key(self, parent_key: PrefixKey) -> None:
        """set_parent from the one-value form (as snapshots keep it)."""
        if isinstance(parent_key, int):
            self.set_parent(parent_key, "")
        else:
            self.set_parent(0, parent_key)

    def has_parent(self, parent_node: int, salt: str) -> bool:
        """Whether the prefix before this block is node `parent_node`, or (0) salt's root."""
        return self.parent_node == parent_node and (parent_node != 0 or self.root_salt == salt)

    def forget_prefix(self) -> None:
        self.block_hash = None
        self.parent_hash = None
        self.tokens = None
        self.node_id = 0
        self.parent_node = 0
        self.root_salt = ""
