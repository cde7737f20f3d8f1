"""Reading tokens back out of the paged cache, for the references and the tests."""
from __future__ import annotations

import torch


def token_slots(block_tables: torch.Tensor, positions: torch.Tensor,
                block_size: int) -> torch.Tensor:
    """slot of context position p of every sequence: block_tables[s, p // block_size] *
    block_size + p % block_size, in int64 (a large block id times the block size overflows
    int32)."""
    blocks = block_tables[:, positions // block_size].long()
    return blocks * block_size + positions % block_size


def gather_context(key_cache: torch.Tensor, value_cache: torch.Tensor,
                   block_tables: torch.Tensor, positions: torch.Tensor,
                   visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at `positions` for every sequence, `[seqs, positions, kv_heads, head_dim]`.
    Positions a sequence does not have (`visible` false) read slot 0 instead of whatever the
    table holds past its last block, and must be masked by the caller."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    slots = token_slots(block_tables, positions, block_size).where(visible, 0)
    keys = key_cache.view(-1, num_kv_heads, head_dim)[slots]
    values = value_cache.view(-1, num_kv_heads, head_dim)[slots]
    return keys, values
