"""copy_blocks in plain torch: one indexed copy over every layer and plane."""
from __future__ import annotations

import torch

from kernels.checks import block_pairs_tensor, check_kv_cache


def copy_blocks_reference(kv_cache: torch.Tensor, block_pairs) -> None:
    check_kv_cache(kv_cache)
    pairs = block_pairs_tensor(block_pairs, kv_cache.shape[2]).to(kv_cache.device)
    kv_cache[:, :, pairs[:, 1]] = kv_cache[:, :, pairs[:, 0]]
