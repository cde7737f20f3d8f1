"""A sequence's entry in a pool: its block table, how far it is hashed, and the tokens after."""
from __future__ import annotations

from array import array

from librt.vecs import vec
from mypy_extensions import i32

from allocator_service.core.block import PrefixKey
from allocator_service.core.block_hash import BlockHash
from pagedserve.protocol.block_ops import SeqId


class Sequence:
    """A plain class, not a dataclass: mypyc compiles a dataclass's __init__ as interpreted
    Python, and one is built for every admitted prompt and every fork (about 1 % of a fleet
    replay's allocator CPU went to that __init__)."""

    __slots__ = ("seq_id", "cache_salt", "block_table", "num_tokens", "unhashed_token_ids",
                 "num_cached_tokens", "num_computed_tokens", "num_hashed_blocks", "chain_hash",
                 "chain_node")

    def __init__(self, seq_id: SeqId, cache_salt: str, block_table: vec[i32],
                 num_tokens: int, unhashed_token_ids: array[int], num_cached_tokens: int,
                 num_computed_tokens: int, num_hashed_blocks: int, chain_hash: BlockHash,
                 chain_node: int) -> None:
        self.seq_id = seq_id
        self.cache_salt = cache_salt
        # Physical block ids in logical order; may run past the last token (slots reserved
        # ahead). A vec of int32 ids: a list held each id as an int object of its own, one
        # more read from cold memory per block (and the collector's walk of every list).
        self.block_table = block_table
        # Tokens the sequence holds, the prompt's and those appended since, hashed or not.
        self.num_tokens = num_tokens
        # The tokens from the first block not yet hashed on (block num_hashed_blocks): all that
        # is still needed, to hash blocks as they fill. The tokens before are covered by
        # chain_hash and kept in the cached blocks. Keeping every token made a fleet's sequences
        # hold about 100 MB of arrays, one grown by reallocation on nearly every Append, copied
        # on each fork and written into every snapshot.
        # An int32 array, not a list: the collector walks every element of every live list on
        # each full collection, and never looks into an array. Token ids are validated to fit
        # (0 to 2**31 - 1) before they get here.
        self.unhashed_token_ids = unhashed_token_ids
        # Prompt tokens served from the prefix cache when the sequence was allocated.
        self.num_cached_tokens = num_cached_tokens
        # Tokens whose K/V the executor reported written; only these may enter the prefix cache.
        self.num_computed_tokens = num_computed_tokens
        # Leading full blocks already offered to the prefix cache, and the chain state after.
        self.num_hashed_blocks = num_hashed_blocks
        self.chain_hash = chain_hash
        # The node id of the last hashed block's prefix, 0 before the first (the salt's root).
        self.chain_node = chain_node

    @property
    def chain_key(self) -> PrefixKey:
        """The chain's prefix identity in its one-value form: a node id, or the salt."""
        return self.chain_node if self.chain_node else self.cache_salt

    def __repr__(self) -> str:
        return (f"Sequence(seq_id={self.seq_id!r}, num_tokens={self.num_tokens}, "
                f"blocks={self.block_ids()}, num_hashed_blocks={self.num_hashed_blocks})")

    def block_ids(self) -> list[int]:
        return [int(block) for block in self.block_table]
