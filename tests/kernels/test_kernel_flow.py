"""The kernels composed the way an executor drives them, through the public entry points: a
prompt prefilled in chunks, decode steps, a fork that shares the prompt's blocks and copies the
partial last block on write, both branches decoding on. Every attention output is checked
against SDPA over the sequence's history kept contiguously on the side."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

import kernels
from kernels import KvCacheSpec, allocate_kv_cache, layer_caches
from tests.support.kernel_cases import KERNEL_TOLERANCE, plain_attention, randn, require_triton

BLOCK_SIZE, NUM_KV_HEADS, GROUP, HEAD_DIM = 16, 2, 3, 64
SCALE = HEAD_DIM ** -0.5


@dataclass
class Sequence:
    blocks: list[int]
    keys: list[torch.Tensor] = field(default_factory=list)     # one [kv_heads, head_dim] per token
    values: list[torch.Tensor] = field(default_factory=list)

    def slots(self, first: int, count: int) -> list[int]:
        return [self.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                for p in range(first, first + count)]


def implementations(mode: str):
    """(store_kv, prefill, decode, copy_blocks): the dispatcher, or the Triton launchers called
    directly (interpreted on the CPU)."""
    if mode == "dispatch":
        return (kernels.store_kv, kernels.paged_prefill_attention,
                kernels.paged_decode_attention, kernels.copy_blocks)
    from kernels.triton.copy_blocks import copy_blocks_triton
    from kernels.triton.decode_attention import paged_decode_attention_triton
    from kernels.triton.prefill_attention import paged_prefill_attention_triton
    from kernels.triton.store_kv import store_kv_triton

    return (store_kv_triton, paged_prefill_attention_triton, paged_decode_attention_triton,
            copy_blocks_triton)


@pytest.mark.parametrize("mode, device", [
    pytest.param("dispatch", "cpu", id="references-on-cpu"),
    pytest.param("triton", "cpu", id="triton-interpreter"),
    pytest.param("dispatch", "cuda", id="triton-on-cuda", marks=pytest.mark.gpu),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_chunked_prefill_decode_and_fork_match_sdpa(mode, device, dtype):
    if mode == "triton":
        require_triton(device)
    store_kv, prefill, decode, copy_blocks = implementations(mode)
    spec = KvCacheSpec(num_layers=2, num_blocks=12, block_size=BLOCK_SIZE,
                       num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, dtype=dtype)
    kv_cache = allocate_kv_cache(spec, device)
    stale = randn(*spec.shape, dtype=dtype, seed=99, device=device)   # never zeros
    kv_cache.copy_(stale)
    key_cache, value_cache = layer_caches(kv_cache, 1)
    seed = iter(range(1000))
    tolerance = KERNEL_TOLERANCE[dtype]

    def new_tokens(count: int):
        shape = (count, NUM_KV_HEADS, HEAD_DIM)
        return (randn(count, NUM_KV_HEADS * GROUP, HEAD_DIM, dtype=dtype, seed=next(seed),
                      device=device),
                randn(*shape, dtype=dtype, seed=next(seed), device=device),
                randn(*shape, dtype=dtype, seed=next(seed), device=device))

    def expected(seq: Sequence, query: torch.Tensor) -> torch.Tensor:
        return plain_attention(query, torch.stack(seq.keys), torch.stack(seq.values), SCALE)

    def table(*seqs: Sequence) -> torch.Tensor:
        width = max(len(seq.blocks) for seq in seqs)
        return torch.tensor([seq.blocks + [-1] * (width - len(seq.blocks)) for seq in seqs],
                            dtype=torch.int32, device=device)

    def lengths(*seqs: Sequence) -> torch.Tensor:
        return torch.tensor([len(seq.keys) for seq in seqs], dtype=torch.int32, device=device)

    # Prefill a 37-token prompt in chunks of 20 and 17, into blocks 7, 2, 9.
    prompt = Sequence(blocks=[7, 2, 9])
    for chunk in (20, 17):
        query, key, value = new_tokens(chunk)
        slots = prompt.slots(len(prompt.keys), chunk)
        store_kv(key, value, key_cache, value_cache,
                 torch.tensor(slots, dtype=torch.int64, device=device))
        prompt.keys += list(key)
        prompt.values += list(value)
        out = prefill(query, key_cache, value_cache, table(prompt),
                      torch.tensor([0, chunk], dtype=torch.int32, device=device),
                      lengths(prompt), SCALE, out=torch.full_like(query, float("nan")))
        torch.testing.assert_close(out, expected(prompt, query), **tolerance)

    # Fork: the child shares blocks 7 and 2 and gets block 4 as a copy of the shared, partially
    # filled block 9 (copy-on-write before its first write).
    copy_blocks(kv_cache, [(9, 4)])
    child = Sequence(blocks=[7, 2, 4], keys=list(prompt.keys), values=list(prompt.values))

    # Both decode three steps in one batch, plus a padding row (slot -1, context 0).
    for _ in range(3):
        query, key, value = new_tokens(3)
        slots = prompt.slots(len(prompt.keys), 1) + child.slots(len(child.keys), 1) + [-1]
        store_kv(key, value, key_cache, value_cache,
                 torch.tensor(slots, dtype=torch.int64, device=device))
        for seq, token in ((prompt, 0), (child, 1)):
            seq.keys.append(key[token])
            seq.values.append(value[token])
        padding = Sequence(blocks=[0])
        out = decode(query, key_cache, value_cache, table(prompt, child, padding),
                     lengths(prompt, child, padding), SCALE,
                     out=torch.full_like(query, float("nan")))
        torch.testing.assert_close(out[0:1], expected(prompt, query[0:1]), **tolerance)
        torch.testing.assert_close(out[1:2], expected(child, query[1:2]), **tolerance)
        assert torch.equal(out[2], torch.zeros_like(out[2]))
    # Layer 0 saw only the copy-on-write (block 9 into 4); the attention ran on layer 1.
    stale[0, :, 4] = stale[0, :, 9]
    assert torch.equal(kv_cache[0], stale[0])
