"""A sequence's entry in a pool: its block table, how far it is hashed, and the tokens after."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

from allocator_service.core.block import Block, PrefixKey
from allocator_service.core.block_hash import BlockHash
from pagedserve.protocol.block_ops import SeqId


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: SeqId
    cache_salt: str
    # Physical blocks in logical order; may run past the last token (slots reserved ahead).
    block_table: list[Block]
    # Tokens the sequence holds, the prompt's and those appended since, hashed or not.
    num_tokens: int
    # The tokens from the first block not yet hashed on (block num_hashed_blocks): all that is
    # still needed, to hash blocks as they fill. The tokens before are covered by chain_hash
    # and kept in the cached blocks. Keeping every token made a fleet's sequences hold about
    # 100 MB of arrays, one grown by reallocation on nearly every Append, copied on each fork
    # and written into every snapshot.
    # An int32 array, not a list: the collector walks every element of every live list on each
    # full collection, and never looks into an array. Token ids are validated to fit (0 to
    # 2**31 - 1) before they get here.
    unhashed_token_ids: array[int]
    # Prompt tokens served from the prefix cache when the sequence was allocated.
    num_cached_tokens: int
    # Tokens whose K/V the executor reported written; only these may enter the prefix cache.
    num_computed_tokens: int
    # Leading full blocks already offered to the prefix cache, and the chain state after them.
    num_hashed_blocks: int
    chain_hash: BlockHash
    chain_key: PrefixKey

    def block_ids(self) -> list[int]:
        return [block.block_id for block in self.block_table]
