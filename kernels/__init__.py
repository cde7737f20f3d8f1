"""Paged-attention kernels: Triton on CUDA, a pure-torch reference beside each for the CPU.

The public functions (re-exported from `dispatch`) take the KV cache in the layout described in
`kv_cache` and pick the implementation from the tensors' device. Each kernel has one file with
its launcher under `kernels/triton/` (`store_kv`, `decode_attention`, `prefill_attention`,
`copy_blocks`) and its reference under the same name in `kernels/reference/`.
"""
from kernels.dispatch import (
    copy_blocks,
    paged_decode_attention,
    paged_prefill_attention,
    store_kv,
)
from kernels.kv_cache import KvCacheSpec, allocate_kv_cache, layer_caches

__all__ = [
    "KvCacheSpec",
    "allocate_kv_cache",
    "copy_blocks",
    "layer_caches",
    "paged_decode_attention",
    "paged_prefill_attention",
    "store_kv",
]
