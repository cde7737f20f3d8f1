"""store_kv in plain torch: an indexed copy into the cache viewed as one row per slot."""
from __future__ import annotations

import torch

from kernels.checks import check_store_kv_args


def store_kv_reference(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    check_store_kv_args(key, value, key_cache, value_cache, slot_mapping)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, num_kv_heads, head_dim)[slots] = key[valid]
    value_cache.view(-1, num_kv_heads, head_dim)[slots] = value[valid]
