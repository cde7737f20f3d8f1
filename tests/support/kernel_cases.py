"""Random paged batches for the kernel tests, and plain attention to check them against.

A batch puts each sequence's tokens into randomly chosen, shuffled blocks of a cache filled with
random values everywhere (a kernel that reads the wrong block or slot reads other random values,
never a lucky zero). Block table entries past a sequence's last block are -1, so a kernel that
reads them goes out of bounds instead of silently reading block 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from kernels.triton_support import interpreting

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BLOCK_SIZES = [16, 32, 64, 128, 256]

# Where the kernel under test runs: Triton's interpreter on the CPU, or compiled on a GPU.
TRITON_DEVICES = [
    pytest.param("cpu", id="interpreter"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]

# Triton against the torch reference: both accumulate in fp32, so they differ by the rounding of
# the output and, below fp32, of the probabilities fed to the second matmul.
KERNEL_TOLERANCE = {torch.float32: dict(atol=2e-5, rtol=2e-5),
                    torch.float16: dict(atol=2e-3, rtol=2e-3),
                    torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# The reference against SDPA on the same (rounded) inputs: only the output rounding differs.
REFERENCE_TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5),
                       torch.float16: dict(atol=1e-3, rtol=1e-3),
                       torch.bfloat16: dict(atol=8e-3, rtol=8e-3)}


def require_triton(device: str) -> None:
    """Skips unless Triton can run here: compiled on CUDA, or in its interpreter on the CPU."""
    pytest.importorskip("triton")
    if device == "cpu" and not interpreting():
        pytest.skip("Triton kernels run on the CPU only with TRITON_INTERPRET=1")


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    """Fresh standard-normal values (made on the CPU so every device sees the same numbers)."""
    return torch.randn(*shape, generator=generator(seed)).to(dtype=dtype, device=device)


def nan_like(tensor: torch.Tensor) -> torch.Tensor:
    """An output poisoned with NaN, so an element the kernel forgets to write fails the test."""
    return torch.full_like(tensor, float("nan"))


@dataclass(slots=True)
class PagedBatch:
    key_cache: torch.Tensor      # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor   # [num_seqs, max_blocks], -1 past each sequence's blocks
    lengths: list[int]           # tokens in each sequence's context
    blocks: list[list[int]]      # each sequence's block ids, in order

    @property
    def block_size(self) -> int:
        return self.key_cache.shape[1]

    def lengths_tensor(self) -> torch.Tensor:
        return torch.tensor(self.lengths, dtype=torch.int32, device=self.key_cache.device)

    def contiguous(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence `seq`'s K and V as `[tokens, kv_heads, head_dim]`, read block by block."""
        keys = torch.cat([self.key_cache[block] for block in self.blocks[seq]])
        values = torch.cat([self.value_cache[block] for block in self.blocks[seq]])
        return keys[:self.lengths[seq]], values[:self.lengths[seq]]


def make_paged_batch(lengths: list[int], *, block_size: int, num_kv_heads: int, head_dim: int,
                     dtype: torch.dtype, seed: int, device: str = "cpu", spare_blocks: int = 3,
                     num_blocks: int | None = None, table_dtype: torch.dtype = torch.int32,
                     ) -> PagedBatch:
    """Sequences of the given context lengths in shuffled blocks. With `num_blocks` far beyond
    what the batch needs, the cache is left unwritten except for the blocks in use (the pages of
    a huge empty tensor are never touched) and the blocks are drawn from its top end."""
    needed = [math.ceil(length / block_size) for length in lengths]
    huge = num_blocks is not None
    num_blocks = num_blocks or sum(needed) + spare_blocks
    if huge:
        pool = torch.arange(num_blocks - sum(needed) - spare_blocks, num_blocks)
    else:
        pool = torch.arange(num_blocks)
    pool = pool[torch.randperm(len(pool), generator=generator(seed))].tolist()
    blocks, start = [], 0
    for count in needed:
        blocks.append(pool[start:start + count])
        start += count

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.empty(shape, dtype=dtype, device=device)
    value_cache = torch.empty(shape, dtype=dtype, device=device)
    filled = pool if huge else list(range(num_blocks))
    index = torch.tensor(filled, device=device)
    key_cache[index] = randn(len(filled), *shape[1:], dtype=dtype, seed=seed + 1, device=device)
    value_cache[index] = randn(len(filled), *shape[1:], dtype=dtype, seed=seed + 2, device=device)

    poison_unused_slots(key_cache, value_cache, blocks, lengths, filled)
    width = max(needed, default=0) + 1
    table = torch.full((len(lengths), width), -1, dtype=table_dtype)
    for row, ids in enumerate(blocks):
        table[row, :len(ids)] = torch.tensor(ids, dtype=table_dtype)
    return PagedBatch(key_cache, value_cache, table.to(device), list(lengths), blocks)


def poison_unused_slots(key_cache: torch.Tensor, value_cache: torch.Tensor,
                       blocks: list[list[int]], lengths: list[int], filled: list[int]) -> None:
    """NaN in every filled slot no sequence's context covers: the tail of each last block and
    the blocks nobody holds. Never-written cache memory can hold NaN, and a kernel that lets a
    masked-out slot reach its sums (0 x NaN is NaN) must fail here, not in production."""
    block_size = key_cache.shape[1]
    used = {block for ids in blocks for block in ids}
    spare = [block for block in filled if block not in used]
    for cache in (key_cache, value_cache):
        if spare:
            cache[torch.tensor(spare, device=cache.device)] = float("nan")
        for ids, length in zip(blocks, lengths):
            if ids and length % block_size:
                cache[ids[-1], length % block_size:] = float("nan")


def plain_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                    ) -> torch.Tensor:
    """SDPA of `query [q, q_heads, d]` over `keys/values [k, kv_heads, d]`, query i sitting at
    position k - q + i and seeing positions up to its own (decode: q = 1 sees everything)."""
    num_queries, num_keys = query.shape[0], keys.shape[0]
    query_pos = torch.arange(num_keys - num_queries, num_keys)
    visible = torch.arange(num_keys)[None, :] <= query_pos[:, None]
    out = F.scaled_dot_product_attention(
        query.float().transpose(0, 1)[None], keys.float().transpose(0, 1)[None],
        values.float().transpose(0, 1)[None], attn_mask=visible.to(query.device), scale=scale,
        enable_gqa=True)
    return out[0].transpose(0, 1).to(query.dtype)
