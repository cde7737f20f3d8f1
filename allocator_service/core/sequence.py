"""A sequence's entry in a pool: its tokens, its block table and how far it is hashed."""
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
    # An int32 array, not a list: the collector walks every element of every live list on each
    # full collection (a fleet's sequences hold millions of tokens), and never looks into an
    # array. Token ids are validated to fit (0 to 2**31 - 1) before they get here.
    token_ids: array[int]
    # Prompt tokens served from the prefix cache when the sequence was allocated.
    num_cached_tokens: int
    # Tokens whose K/V the executor reported written; only these may enter the prefix cache.
    num_computed_tokens: int
    # Leading full blocks already offered to the prefix cache, and the chain state after them.
    num_hashed_blocks: int
    chain_hash: BlockHash
    chain_key: PrefixKey

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def block_ids(self) -> list[int]:
        return [block.block_id for block in self.block_table]
