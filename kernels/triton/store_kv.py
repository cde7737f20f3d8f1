"""Write a step's new keys and values into their cache slots (Triton).

Each program copies one token's K and V for all kv heads: `num_kv_heads * head_dim` elements,
contiguous in the cache (see kv_cache.py), from `key[token]` / `value[token]` to the slot
`slot_mapping[token]`. A slot of -1 marks a padding token and is skipped. Offsets are int64:
`slot * num_kv_heads * head_dim` passes 2**31 long before a large cache fills a GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import check_store_kv_args
from kernels.triton_support import next_power_of_2

# The K/V strides follow the caller's views: int64 and never specialised, so any view runs the
# one compiled variant.
VARYING_INTEGERS = ("key_stride_token", "key_stride_head", "value_stride_token",
                    "value_stride_head")


@triton.jit(do_not_specialize=VARYING_INTEGERS)
def _store_kv_kernel(
    key_ptr,           # [num_tokens, num_kv_heads, head_dim], any token/head strides
    value_ptr,         # [num_tokens, num_kv_heads, head_dim], any token/head strides
    key_cache_ptr,     # [num_blocks * block_size, num_kv_heads, head_dim], contiguous
    value_cache_ptr,   # [num_blocks * block_size, num_kv_heads, head_dim], contiguous
    slot_mapping_ptr,  # [num_tokens], int32/int64, -1 = padding
    key_stride_token: tl.int64, key_stride_head: tl.int64,
    value_stride_token: tl.int64, value_stride_head: tl.int64,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    head = tl.arange(0, HEADS_PAD)[:, None]
    channel = tl.arange(0, HEAD_DIM_PAD)[None, :]
    mask = (head < NUM_KV_HEADS) & (channel < HEAD_DIM)
    cache_offset = slot * (NUM_KV_HEADS * HEAD_DIM) + head * HEAD_DIM + channel

    key = tl.load(key_ptr + token * key_stride_token + head * key_stride_head + channel, mask=mask)
    tl.store(key_cache_ptr + cache_offset, key, mask=mask)
    value = tl.load(value_ptr + token * value_stride_token + head * value_stride_head + channel,
                    mask=mask)
    tl.store(value_cache_ptr + cache_offset, value, mask=mask)


def store_kv_triton(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """cache[slot_mapping[i]] = key[i] (and value) for every token i whose slot is not -1."""
    check_store_kv_args(key, value, key_cache, value_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=next_power_of_2(num_kv_heads), HEAD_DIM_PAD=next_power_of_2(head_dim),
    )
