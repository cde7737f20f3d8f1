"""Paged decode attention in plain torch: each sequence's context gathered from its blocks, then
softmax attention in fp32, one sequence at a time over exactly its own context. The yardstick
the Triton kernel and the CPU serving path (kernels/cpu/decode_attention.py) are tested against.
"""
from __future__ import annotations

import torch

from kernels.checks import check_decode_args, check_output
from kernels.reference.gather import causal_attention, sequence_context


def paged_decode_attention_reference(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
    max_context_len: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as kernels.triton.decode_attention.paged_decode_attention_triton."""
    lengths = context_lens.tolist()
    check_decode_args(query, key_cache, value_cache, block_tables, context_lens,
                      max(lengths, default=0) if max_context_len is None
                      else max_context_len)
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    for seq, length in enumerate(lengths):
        if length == 0:  # a padding row: defined to give zeros
            out[seq] = 0
            continue
        keys, values = sequence_context(key_cache, value_cache, block_tables[seq], length)
        out[seq] = causal_attention(query[seq:seq + 1], keys, values, scale)[0].to(out.dtype)
    return out
