"""One physical KV-cache block as the allocator sees it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType

from allocator_service.core.block_hash import BlockHash, PackedTokens, unpack_tokens

BlockId = NewType("BlockId", int)

# Identity of a cached prefix: the salt string for "no block yet" (the root of a tenant's chain),
# then a node id that is unique for the allocator's lifetime. Comparing identities instead of
# hashes makes a prefix hit exact even when two different prefixes collide on their hash.
PrefixKey = int | str


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

    def set_parent_key(self, parent_key: PrefixKey) -> None:
        if isinstance(parent_key, int):
            self.parent_node, self.root_salt = parent_key, ""
        else:
            self.parent_node, self.root_salt = 0, parent_key

    def has_parent_key(self, parent_key: PrefixKey) -> bool:
        """Whether the prefix before this block is `parent_key`."""
        if isinstance(parent_key, int):
            return self.parent_node == parent_key
        return self.parent_node == 0 and self.root_salt == parent_key

    def forget_prefix(self) -> None:
        self.block_hash = None
        self.parent_hash = None
        self.tokens = None
        self.node_id = 0
        self.parent_node = 0
        self.root_salt = ""
