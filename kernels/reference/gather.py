"""Reading one sequence's context back out of the paged cache, and attending over it: the part
both attention references share."""
from __future__ import annotations

import torch


def sequence_context(key_cache: torch.Tensor, value_cache: torch.Tensor,
                     table_row: torch.Tensor, length: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions 0 .. length-1, `[length, kv_heads, head_dim]`: position p is slot
    p % block_size of block table_row[p // block_size], in int64 (a large block id times the
    block size overflows int32)."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    positions = torch.arange(length, device=key_cache.device)
    slots = table_row[positions // block_size].long() * block_size + positions % block_size
    return (key_cache.view(-1, num_kv_heads, head_dim)[slots],
            value_cache.view(-1, num_kv_heads, head_dim)[slots])


def causal_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """fp32 softmax attention of `query [q, q_heads, d]` over `keys/values [k, kv_heads, d]`:
    query i sits at position k - q + i and sees positions up to its own (a decode, q = 1, sees
    everything). Query head h reads kv head h // (q_heads / kv_heads)."""
    num_queries, num_q_heads, head_dim = query.shape
    num_keys, num_kv_heads = keys.shape[0], keys.shape[1]
    group = num_q_heads // num_kv_heads
    # One plain batched matmul per kv head, its group's rows stacked: [kv, group * q, d].
    grouped = query.float().view(num_queries, num_kv_heads, group, head_dim) \
        .permute(1, 2, 0, 3).reshape(num_kv_heads, group * num_queries, head_dim)
    scores = grouped @ keys.float().permute(1, 2, 0) * scale            # [kv, group * q, k]
    if num_queries > 1:
        query_pos = torch.arange(num_keys - num_queries, num_keys, device=query.device)
        hidden = torch.arange(num_keys, device=query.device)[None, :] > query_pos[:, None]
        scores.view(num_kv_heads, group, num_queries, num_keys).masked_fill_(
            hidden, float("-inf"))
    result = torch.softmax(scores, dim=-1) @ values.float().transpose(0, 1)
    return result.view(num_kv_heads, group, num_queries, head_dim).permute(2, 0, 1, 3) \
        .reshape(num_queries, num_q_heads, head_dim)
