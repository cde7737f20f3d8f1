"""Paged prefill attention in plain torch: one sequence at a time, its context gathered from the
cache and a causal mask offset by the cached prefix, in fp32."""
from __future__ import annotations

import torch

from kernels.checks import check_output, check_prefill_args
from kernels.reference.gather import causal_attention, sequence_context


def paged_prefill_attention_reference(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
    scale: float, *, max_query_len: int | None = None, max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as kernels.triton.prefill_attention.paged_prefill_attention_triton."""
    del max_query_len  # read from the lengths below
    lens = seq_lens.tolist()
    starts = query_start_loc.tolist()
    check_prefill_args(query, key_cache, value_cache, block_tables, query_start_loc,
                       seq_lens, max(lens, default=0) if max_seq_len is None else max_seq_len)
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    for seq, seq_len in enumerate(lens):
        first, last = starts[seq], starts[seq + 1]
        query_len = last - first
        if query_len == 0:
            continue
        if not 0 < query_len <= seq_len:
            raise ValueError(f"sequence {seq} has {query_len} new tokens but a context of "
                             f"{seq_len}")
        keys, values = sequence_context(key_cache, value_cache, block_tables[seq], seq_len)
        out[first:last] = causal_attention(query[first:last], keys, values, scale).to(out.dtype)
    return out
