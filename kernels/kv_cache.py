"""The KV-cache layout every kernel agrees on, and the checks the launchers share.

One tensor holds the whole cache of a model:

    kv_cache[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
              layer    K/V   block     token slot   kv head       channel

so layer `l`'s key cache is the contiguous view `kv_cache[l, 0]` of shape
`[num_blocks, block_size, num_kv_heads, head_dim]`, and a token's slot is
`block_id * block_size + offset`: viewed as `[num_slots, num_kv_heads, head_dim]`, a slot is one
row. Keeping every layer in one allocation lets copy-on-write copy a block in all layers with a
single launch (see triton/copy_blocks.py), and a token's K (or V) for all heads is one contiguous
run of `num_kv_heads * head_dim` elements, which is what store_kv writes and what the attention
kernels read per token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.checks import check_block_size, check_cache_dtype


@dataclass(frozen=True, slots=True)
class KvCacheSpec:
    """What the cache of one model on one device looks like."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_layers, 2, self.num_blocks, self.block_size, self.num_kv_heads,
                self.head_dim)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes across all layers, K and V."""
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * \
            element_size


def allocate_kv_cache(spec: KvCacheSpec, device: torch.device | str) -> torch.Tensor:
    """A zeroed cache. A block's content is only ever read after store_kv wrote it, so the
    zeros are not for correctness: writing every page commits the memory now. The kernel
    gives an empty CPU tensor its pages one by one, on first write, so the process would
    grow for as long as traffic reaches blocks never used before (minutes for the default
    pool: the soak saw it as a leak) and a host short of memory would fail mid-serving
    instead of at startup. On a GPU the memory is committed either way; the fill costs one
    memset."""
    check_block_size(spec.block_size)
    check_cache_dtype(spec.dtype)
    return torch.zeros(spec.shape, dtype=spec.dtype, device=device)


def layer_caches(kv_cache: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache) of one layer, each `[num_blocks, block_size, heads, head_dim]`."""
    return kv_cache[layer, 0], kv_cache[layer, 1]
