"""paged_prefill_attention: causal attention of a flattened varlen batch of new tokens over
paged contexts that may already hold a cached prefix. The reference against SDPA on the
gathered K/V, the CPU implementation and the Triton kernel against the reference."""
from __future__ import annotations

import itertools

import pytest
import torch

from kernels.cpu.prefill_attention import paged_prefill_attention_cpu
from kernels.reference.prefill_attention import paged_prefill_attention_reference
from tests.support.kernel_cases import (BLOCK_SIZES, DTYPES, KERNEL_TOLERANCE, REFERENCE_TOLERANCE,
                                        TRITON_DEVICES, make_paged_batch, nan_like, plain_attention,
                                        randn, require_triton)

# (context after the step, new tokens): a fresh prompt, a decode-like single token, an odd chunk
# after a cached prefix (prefix-cache hit or chunked prefill), a fresh prompt of one token, and
# a long tail over a long prefix.
MIXED = [(15, 15), (17, 1), (40, 23), (1, 1), (1000, 70)]


def prefill_case(mix, *, block_size, group, head_dim, dtype, seed, device="cpu",
                 num_kv_heads=2, **batch_options):
    lengths = [context for context, _ in mix]
    batch = make_paged_batch(lengths, block_size=block_size, num_kv_heads=num_kv_heads,
                             head_dim=head_dim, dtype=dtype, seed=seed, device=device,
                             **batch_options)
    query_lens = [new for _, new in mix]
    starts = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32,
                          device=device)
    query = randn(sum(query_lens), num_kv_heads * group, head_dim, dtype=dtype, seed=seed + 3,
                  device=device)
    return batch, query, starts


def run_triton(batch, query, starts):
    from kernels.triton.prefill_attention import paged_prefill_attention_triton

    return paged_prefill_attention_triton(
        query, batch.key_cache, batch.value_cache, batch.block_tables, starts,
        batch.lengths_tensor(), query.shape[-1] ** -0.5, out=nan_like(query))


def run_reference(batch, query, starts):
    return paged_prefill_attention_reference(
        query, batch.key_cache, batch.value_cache, batch.block_tables, starts,
        batch.lengths_tensor(), query.shape[-1] ** -0.5, out=nan_like(query))


def run_cpu(batch, query, starts):
    return paged_prefill_attention_cpu(
        query, batch.key_cache, batch.value_cache, batch.block_tables, starts,
        batch.lengths_tensor(), query.shape[-1] ** -0.5, out=nan_like(query))


def expected_by_sdpa(batch, query, starts):
    """Each sequence on its own: its new tokens are the last of its context."""
    pieces = []
    for seq in range(len(batch.lengths)):
        keys, values = batch.contiguous(seq)
        pieces.append(plain_attention(query[starts[seq]:starts[seq + 1]], keys, values,
                                      query.shape[-1] ** -0.5))
    return torch.cat(pieces)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, head_dim", [(1, 64), (4, 128), (7, 64)])
def test_reference_equals_causal_sdpa_with_cached_prefix(block_size, dtype, group, head_dim):
    batch, query, starts = prefill_case(MIXED, block_size=block_size, group=group,
                                        head_dim=head_dim, dtype=dtype, seed=block_size + group)
    torch.testing.assert_close(run_reference(batch, query, starts),
                               expected_by_sdpa(batch, query, starts),
                               **REFERENCE_TOLERANCE[dtype])


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, head_dim", [(1, 64), (4, 128), (7, 64)])
def test_cpu_implementation_matches_reference(block_size, dtype, group, head_dim):
    batch, query, starts = prefill_case(MIXED, block_size=block_size, group=group,
                                        head_dim=head_dim, dtype=dtype,
                                        seed=5 * block_size + group)
    torch.testing.assert_close(run_cpu(batch, query, starts),
                               run_reference(batch, query, starts), **KERNEL_TOLERANCE[dtype])


def test_cpu_implementation_with_block_ids_past_32_bit_element_offsets():
    batch, query, starts = prefill_case([(40, 40), (100, 30)], block_size=16, group=4,
                                        head_dim=64, dtype=torch.float16, seed=4,
                                        num_kv_heads=1, num_blocks=(1 << 21) + 64)
    torch.testing.assert_close(run_cpu(batch, query, starts),
                               expected_by_sdpa(batch, query, starts),
                               **KERNEL_TOLERANCE[torch.float16])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_matches_reference_for_every_block_size_and_dtype(device, block_size, dtype):
    require_triton(device)
    batch, query, starts = prefill_case(MIXED, block_size=block_size, group=4, head_dim=64,
                                        dtype=dtype, seed=3 * block_size, device=device)
    torch.testing.assert_close(run_triton(batch, query, starts),
                               run_reference(batch, query, starts), **KERNEL_TOLERANCE[dtype])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("group, head_dim", [(1, 64), (1, 128), (4, 128), (7, 64), (7, 128),
                                             (16, 64)])
def test_triton_matches_reference_for_every_group_and_head_dim(device, group, head_dim):
    """Groups of 1 to 16 query heads per kv head change how rows pack into a program's tile."""
    require_triton(device)
    batch, query, starts = prefill_case(MIXED, block_size=16, group=group, head_dim=head_dim,
                                        dtype=torch.float16, seed=group + head_dim, device=device)
    torch.testing.assert_close(run_triton(batch, query, starts),
                               run_reference(batch, query, starts),
                               **KERNEL_TOLERANCE[torch.float16])


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_chunked_prefill_equals_the_whole_prompt_at_once(device):
    """A 150-token prompt attended in chunks of 64, 64 and 22 (each over the cache holding the
    chunks before it) gives the rows the whole prompt gives in one step."""
    require_triton(device)
    batch, query, _ = prefill_case([(150, 150)], block_size=32, group=2, head_dim=64,
                                   dtype=torch.float32, seed=9, device=device)
    whole = run_triton(batch, query, torch.tensor([0, 150], dtype=torch.int32, device=device))
    for first, last in [(0, 64), (64, 128), (128, 150)]:
        batch.lengths[0] = last
        chunk = run_triton(batch, query[first:last].contiguous(),
                           torch.tensor([0, last - first], dtype=torch.int32, device=device))
        torch.testing.assert_close(chunk, whole[first:last], **KERNEL_TOLERANCE[torch.float32])


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_block_ids_past_32_bit_element_offsets(device):
    require_triton(device)
    batch, query, starts = prefill_case([(40, 40), (100, 30)], block_size=16, group=4,
                                        head_dim=64, dtype=torch.float16, seed=4, device=device,
                                        num_kv_heads=1, num_blocks=(1 << 21) + 64)
    assert max(max(ids) for ids in batch.blocks) * 16 * 64 > 2 ** 31
    out = run_triton(batch, query, starts)
    torch.testing.assert_close(out, expected_by_sdpa(batch, query, starts),
                               **KERNEL_TOLERANCE[torch.float16])


def test_more_new_tokens_than_context_is_refused():
    batch, query, starts = prefill_case([(10, 10)], block_size=16, group=1, head_dim=64,
                                        dtype=torch.float32, seed=2)
    batch.lengths[0] = 9
    for run in (run_reference, run_cpu):
        with pytest.raises(ValueError, match="10 new tokens but a context of 9"):
            run(batch, query, starts)
