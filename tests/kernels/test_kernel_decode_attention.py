"""paged_decode_attention: the torch reference against plain SDPA on the gathered K/V, and both
the length-bucketed CPU implementation and the Triton kernel (interpreted on the CPU, compiled
on a GPU) against the reference."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu import decode_attention
from kernels.cpu.decode_attention import length_buckets, paged_decode_attention_cpu
from kernels.reference.decode_attention import paged_decode_attention_reference
from tests.support.kernel_cases import (BLOCK_SIZES, DTYPES, KERNEL_TOLERANCE, REFERENCE_TOLERANCE,
                                        TRITON_DEVICES, make_paged_batch, nan_like, plain_attention,
                                        randn, require_triton)

ODD_CONTEXTS = [1, 15, 17, 1000]


def decode_case(lengths, *, block_size, group, head_dim, dtype, seed, device="cpu",
                num_kv_heads=2, **batch_options):
    batch = make_paged_batch(lengths, block_size=block_size, num_kv_heads=num_kv_heads,
                             head_dim=head_dim, dtype=dtype, seed=seed, device=device,
                             **batch_options)
    query = randn(len(lengths), num_kv_heads * group, head_dim, dtype=dtype, seed=seed + 3,
                  device=device)
    return batch, query


def run_triton(batch, query, **options):
    from kernels.triton.decode_attention import paged_decode_attention_triton

    return paged_decode_attention_triton(
        query, batch.key_cache, batch.value_cache, batch.block_tables, batch.lengths_tensor(),
        query.shape[-1] ** -0.5, out=nan_like(query), **options)


def run_cpu(batch, query):
    return paged_decode_attention_cpu(
        query, batch.key_cache, batch.value_cache, batch.block_tables, batch.lengths_tensor(),
        query.shape[-1] ** -0.5, out=nan_like(query))


def run_reference(batch, query):
    return paged_decode_attention_reference(
        query, batch.key_cache, batch.value_cache, batch.block_tables, batch.lengths_tensor(),
        query.shape[-1] ** -0.5, out=nan_like(query))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, head_dim", [(1, 64), (4, 128), (7, 64)])
def test_reference_equals_sdpa_on_gathered_context(block_size, dtype, group, head_dim):
    batch, query = decode_case(ODD_CONTEXTS, block_size=block_size, group=group,
                               head_dim=head_dim, dtype=dtype, seed=block_size + group)
    out = run_reference(batch, query)
    for seq in range(len(ODD_CONTEXTS)):
        keys, values = batch.contiguous(seq)
        expected = plain_attention(query[seq:seq + 1], keys, values, head_dim ** -0.5)
        torch.testing.assert_close(out[seq:seq + 1], expected, **REFERENCE_TOLERANCE[dtype])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, head_dim", [(1, 64), (4, 128), (7, 64)])
def test_triton_matches_reference(device, block_size, dtype, group, head_dim):
    require_triton(device)
    batch, query = decode_case(ODD_CONTEXTS, block_size=block_size, group=group,
                               head_dim=head_dim, dtype=dtype, seed=7 * block_size + group,
                               device=device)
    torch.testing.assert_close(run_triton(batch, query), run_reference(batch, query),
                               **KERNEL_TOLERANCE[dtype])


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, head_dim", [(1, 64), (4, 128), (7, 64)])
def test_cpu_implementation_matches_reference(block_size, dtype, group, head_dim):
    batch, query = decode_case(ODD_CONTEXTS, block_size=block_size, group=group,
                               head_dim=head_dim, dtype=dtype, seed=5 * block_size + group)
    torch.testing.assert_close(run_cpu(batch, query), run_reference(batch, query),
                               **KERNEL_TOLERANCE[dtype])


def test_cpu_implementation_on_a_chat_like_batch_split_into_buckets():
    """Many short contexts, a few long ones and padding rows, in shuffled order: several
    buckets, each row written where it came from."""
    generator = torch.Generator().manual_seed(9)
    lengths = torch.randint(1, 120, (40,), generator=generator).tolist() + [700, 1000, 0, 33, 0]
    order = torch.randperm(len(lengths), generator=generator).tolist()
    lengths = [lengths[i] for i in order]
    buckets = length_buckets(lengths, 16)
    assert len(buckets) > 2
    assert sorted(row for bucket in buckets for row in bucket) == \
        [row for row, length in enumerate(lengths) if length]
    batch, query = decode_case(lengths, block_size=16, group=4, head_dim=64,
                               dtype=torch.float32, seed=13)
    out = run_cpu(batch, query)
    torch.testing.assert_close(out, run_reference(batch, query),
                               **KERNEL_TOLERANCE[torch.float32])
    assert not out.isnan().any()


def test_length_buckets_bound_their_padding():
    lengths = [1000, 990, 500, 480, 470, 100, 90, 20, 17, 16, 1]
    for bucket in length_buckets(lengths, 16):
        blocks = [-(-lengths[row] // 16) for row in bucket]
        assert blocks[0] == max(blocks)
        assert blocks[0] * len(blocks) <= 1.25 * sum(blocks)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_contexts_filling_one_some_and_all_segments_match_reference(device):
    """Segments are whole tiles: 64 tokens fill one, 65 two, 1024 all sixteen exactly and 1025
    sixteen of two tiles with the last one short; 0 is a padding row."""
    require_triton(device)
    from kernels.triton.decode_attention import SEGMENTS, TILE

    lengths = [1, TILE, TILE + 1, 5 * TILE + 3, SEGMENTS * TILE, SEGMENTS * TILE + 1, 0]
    batch, query = decode_case(lengths, block_size=32, group=4, head_dim=64,
                               dtype=torch.float32, seed=17, device=device)
    out = run_triton(batch, query)
    torch.testing.assert_close(out, run_reference(batch, query), **KERNEL_TOLERANCE[torch.float32])
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_long_context_spread_over_every_segment_matches_reference(device):
    """One sequence of 3000 tokens: sixteen segments of three tiles, the last one short."""
    require_triton(device)
    batch, query = decode_case([3000], block_size=16, group=4, head_dim=64, dtype=torch.float16,
                               seed=11, device=device, num_kv_heads=1)
    torch.testing.assert_close(run_triton(batch, query), run_reference(batch, query),
                               **KERNEL_TOLERANCE[torch.float16])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("implementation", ["triton", "reference", "cpu"])
def test_empty_context_row_gives_zeros_and_leaves_other_rows_exact(device, implementation):
    """A padding row (context 0) must not poison the batch with NaN."""
    if implementation == "triton":
        require_triton(device)
    elif device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    batch, query = decode_case([40, 1, 200], block_size=16, group=2, head_dim=64,
                               dtype=torch.float32, seed=5, device=device)
    if implementation == "cpu" and device == "cuda":
        pytest.skip("the CPU implementation serves CPU caches")
    run = {"triton": lambda: run_triton(batch, query),
           "reference": lambda: run_reference(batch, query),
           "cpu": lambda: run_cpu(batch, query)}[implementation]
    full = run()
    batch.lengths[1] = 0
    padded = run()
    assert torch.equal(padded[1], torch.zeros_like(padded[1]))
    torch.testing.assert_close(padded[[0, 2]], full[[0, 2]], **KERNEL_TOLERANCE[torch.float32])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64], ids=str)
def test_block_ids_past_32_bit_element_offsets(device, table_dtype):
    """Block ids above 2**21 with 16 slots x 1 head x 64 channels put elements past 2**31: the
    cache is 4.3 GB of address space, of which only the used blocks are ever touched."""
    require_triton(device)
    batch, query = decode_case([33, 100], block_size=16, group=4, head_dim=64,
                               dtype=torch.float16, seed=3, device=device, num_kv_heads=1,
                               num_blocks=(1 << 21) + 64, table_dtype=table_dtype)
    assert max(max(ids) for ids in batch.blocks) * 16 * 64 > 2 ** 31
    out = run_triton(batch, query)
    for seq in range(2):
        keys, values = batch.contiguous(seq)
        expected = plain_attention(query[seq:seq + 1], keys, values, 64 ** -0.5)
        torch.testing.assert_close(out[seq:seq + 1], expected, **KERNEL_TOLERANCE[torch.float16])
    torch.testing.assert_close(run_reference(batch, query), out, **KERNEL_TOLERANCE[torch.float16])


@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64], ids=str)
def test_cpu_implementation_with_block_ids_past_32_bit_element_offsets(table_dtype):
    batch, query = decode_case([33, 100], block_size=16, group=4, head_dim=64,
                               dtype=torch.float16, seed=3, num_kv_heads=1,
                               num_blocks=(1 << 21) + 64, table_dtype=table_dtype)
    torch.testing.assert_close(run_cpu(batch, query), run_reference(batch, query),
                               **KERNEL_TOLERANCE[torch.float16])


def test_bad_arguments_are_refused_with_a_message():
    batch, query = decode_case([20], block_size=16, group=2, head_dim=64, dtype=torch.float32,
                               seed=1)
    lengths = batch.lengths_tensor()
    with pytest.raises(ValueError, match="not a multiple of 2 kv heads"):
        paged_decode_attention_reference(query[:, :3], batch.key_cache, batch.value_cache,
                                         batch.block_tables, lengths, 1.0)
    with pytest.raises(ValueError, match="needs more than the 3 blocks"):
        paged_decode_attention_reference(query, batch.key_cache, batch.value_cache,
                                         batch.block_tables, torch.tensor([49], dtype=torch.int32),
                                         1.0)
    with pytest.raises(ValueError, match="query is torch.float16"):
        paged_decode_attention_reference(query.half(), batch.key_cache, batch.value_cache,
                                         batch.block_tables, lengths, 1.0)
    with pytest.raises(ValueError, match="block size 8 is not one of"):
        small = batch.key_cache.view(-1, 8, 2, 64)
        paged_decode_attention_reference(query, small, small, batch.block_tables, lengths, 1.0)
    with pytest.raises(ValueError, match="needs more than the 3 blocks"):
        paged_decode_attention_cpu(query, batch.key_cache, batch.value_cache, batch.block_tables,
                                   torch.tensor([49], dtype=torch.int32), 1.0)


def test_cpu_implementation_inside_and_outside_inference_mode():
    """The workspace the CPU implementation keeps between calls, first made under
    inference_mode (as the engine calls it), is still writable by a call outside it."""
    batch, query = decode_case([40, 7], block_size=16, group=2, head_dim=64,
                               dtype=torch.float32, seed=21)
    decode_attention._workspace.buffers.clear()   # so the call below makes a new one
    with torch.inference_mode():
        inside = run_cpu(batch, query)
    torch.testing.assert_close(run_cpu(batch, query), inside)
