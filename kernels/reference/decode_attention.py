"""Paged decode attention in plain torch: gather every sequence's context into a padded batch,
then masked softmax attention in fp32. Also the CPU implementation, so it is vectorised over
sequences rather than looped."""
from __future__ import annotations

import torch

from kernels.checks import check_decode_args, check_output
from kernels.reference.gather import gather_context


def paged_decode_attention_reference(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
    max_context_len: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as kernels.triton.decode_attention.paged_decode_attention_triton."""
    if max_context_len is None:
        max_context_len = int(context_lens.max()) if context_lens.numel() else 0
    group = check_decode_args(query, key_cache, value_cache, block_tables, context_lens,
                              max_context_len)
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    num_seqs, num_q_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    positions = torch.arange(max_context_len, device=query.device)
    visible = positions[None, :] < context_lens[:, None]                 # [seqs, positions]
    keys, values = gather_context(key_cache, value_cache, block_tables, positions, visible)

    grouped = query.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,slkd->skgl", grouped, keys.float()) * scale
    scores.masked_fill_(~visible[:, None, None, :], float("-inf"))
    # An empty context softmaxes a row of -inf into NaN; it is defined to give zeros.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    result = torch.einsum("skgl,slkd->skgd", probs, values.float())
    out.copy_(result.reshape(num_seqs, num_q_heads, head_dim))
    return out
