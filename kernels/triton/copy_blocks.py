"""Copy-on-write: copy whole blocks, in every layer's K and V, in one launch (Triton).

The allocator answers a write to a shared block with a (src, dst) pair: dst is fresh, and must
hold src's tokens before the new token is stored into it. With every layer in one allocation
(kv_cache.py) a block of layer l, plane k/v starts at ((l * 2 + kv) * num_blocks + block) *
block_numel, so one grid of (pair, layer x plane, chunk) programs covers all copies.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import block_pairs_tensor, check_kv_cache
from kernels.triton_support import next_power_of_2

MAX_CHUNK = 4096      # elements per program: a 16-token block of 8 x 128 heads is 16k


@triton.jit
def _copy_blocks_kernel(
    kv_cache_ptr,       # [num_layers * 2, num_blocks, BLOCK_NUMEL], contiguous
    block_pairs_ptr,    # [num_pairs, 2] int64: (src, dst)
    plane_numel,        # num_blocks * BLOCK_NUMEL, may exceed 2**31
    BLOCK_NUMEL: tl.constexpr, CHUNK: tl.constexpr,
):
    pair = tl.program_id(0).to(tl.int64)
    plane = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    src = tl.load(block_pairs_ptr + pair * 2)
    dst = tl.load(block_pairs_ptr + pair * 2 + 1)
    offset = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offset < BLOCK_NUMEL
    plane_ptr = kv_cache_ptr + plane * plane_numel
    data = tl.load(plane_ptr + src * BLOCK_NUMEL + offset, mask=mask)
    tl.store(plane_ptr + dst * BLOCK_NUMEL + offset, data, mask=mask)


def copy_blocks_triton(kv_cache: torch.Tensor, block_pairs) -> None:
    """kv_cache[:, :, dst] = kv_cache[:, :, src] for every (src, dst) in block_pairs (a list of
    pairs or an int `[pairs, 2]` tensor)."""
    check_kv_cache(kv_cache)
    pairs = block_pairs_tensor(block_pairs, kv_cache.shape[2])
    if not pairs.numel():
        return
    num_layers, _, num_blocks = kv_cache.shape[:3]
    block_numel = kv_cache[0, 0, 0].numel()
    chunk = min(MAX_CHUNK, next_power_of_2(block_numel))
    grid = (pairs.shape[0], num_layers * 2, triton.cdiv(block_numel, chunk))
    _copy_blocks_kernel[grid](kv_cache, pairs.to(kv_cache.device), num_blocks * block_numel,
                              BLOCK_NUMEL=block_numel, CHUNK=chunk)
