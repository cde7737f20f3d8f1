"""How one forward pass's flattened tokens map onto sequences and cache slots.

The model runner lays out a batch with the decode tokens first (one per decoding sequence),
then the prefill tokens of every sequence that is prefilling (a whole prompt, a chunk of one,
or the uncached tail after a prefix-cache hit):

    tokens:  | d0 d1 d2 ... | p0 p0 p0 p0 | p1 p1 | p2 p2 p2 ... |
               decode rows    prefill sequences, query_start marks their starts

Every token's K/V goes to slot_mapping[token] before attention runs, so attention reads the
new tokens from the cache like any earlier ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionBatch:
    slot_mapping: torch.Tensor            # [tokens] int64; -1 = padding, not stored
    num_decode_tokens: int
    # The decode rows: one query token each over context_lens tokens.
    decode_block_tables: torch.Tensor     # [decode rows, max blocks] int32
    decode_context_lens: torch.Tensor     # [decode rows] int32, including the new token
    max_decode_context: int
    # The prefill sequences, their query rows after the decode rows.
    prefill_block_tables: torch.Tensor    # [prefill seqs, max blocks] int32
    prefill_query_start: torch.Tensor     # [prefill seqs + 1] int32, from 0
    prefill_seq_lens: torch.Tensor        # [prefill seqs] int32, context after this step
    max_prefill_query: int
    max_prefill_seq: int

    @property
    def num_prefill_seqs(self) -> int:
        return self.prefill_seq_lens.shape[0]
