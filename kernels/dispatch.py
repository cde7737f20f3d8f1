"""The kernels' public entry points: Triton where the cache is on a GPU, torch where it is on the
CPU (kernels/cpu for attention and store_kv, the reference for block copies). Triton is imported
only on the GPU path, so a machine without it (a laptop) still serves.

`PAGEDSERVE_KERNELS=triton` runs the Triton kernels on CPU tensors too, in Triton's interpreter
(`TRITON_INTERPRET=1`): the whole model through the GPU kernels on a machine without a GPU,
slowly. The tests use it to check the kernels inside the engine and to count the kernel
variants a serving run compiles.
"""
from __future__ import annotations

import os

import torch

from kernels.cpu.decode_attention import paged_decode_attention_cpu
from kernels.cpu.prefill_attention import paged_prefill_attention_cpu
from kernels.cpu.store_kv import store_kv_cpu
from kernels.reference.copy_blocks import copy_blocks_reference

KERNELS_VARIABLE = "PAGEDSERVE_KERNELS"
KERNEL_CHOICES = ("auto", "triton")


def runs_triton(tensor: torch.Tensor) -> bool:
    if tensor.is_cuda:
        return True
    choice = os.environ.get(KERNELS_VARIABLE, "auto")
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"{KERNELS_VARIABLE} must be one of {', '.join(KERNEL_CHOICES)}, "
                         f"got {choice!r}")
    return choice == "triton"


def store_kv(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Writes each token's K and V into the cache slot slot_mapping names (-1: skipped)."""
    if runs_triton(key_cache):
        from kernels.triton import store_kv as kernel
        implementation = kernel.store_kv_triton
    else:
        implementation = store_kv_cpu
    implementation(key, value, key_cache, value_cache, slot_mapping)


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, scale: float, *,
                           max_context_len: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence over its paged context (kernels/triton/decode_attention.py)."""
    if runs_triton(key_cache):
        from kernels.triton import decode_attention as kernel
        implementation = kernel.paged_decode_attention_triton
    else:
        implementation = paged_decode_attention_cpu
    return implementation(query, key_cache, value_cache, block_tables, context_lens, scale,
                          max_context_len=max_context_len, out=out)


def paged_prefill_attention(query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, block_tables: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            scale: float, *, max_query_len: int | None = None,
                            max_seq_len: int | None = None,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of a flattened batch of new tokens over their paged contexts
    (kernels/triton/prefill_attention.py)."""
    if runs_triton(key_cache):
        from kernels.triton import prefill_attention as kernel
        implementation = kernel.paged_prefill_attention_triton
    else:
        implementation = paged_prefill_attention_cpu
    return implementation(query, key_cache, value_cache, block_tables, query_start_loc,
                          seq_lens, scale, max_query_len=max_query_len,
                          max_seq_len=max_seq_len, out=out)


def copy_blocks(kv_cache: torch.Tensor, block_pairs) -> None:
    """Copies every (src, dst) block in all layers, K and V (kernels/triton/copy_blocks.py)."""
    if runs_triton(kv_cache):
        from kernels.triton import copy_blocks as kernel
        implementation = kernel.copy_blocks_triton
    else:
        implementation = copy_blocks_reference
    implementation(kv_cache, block_pairs)
