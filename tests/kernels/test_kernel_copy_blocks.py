"""copy_blocks copies whole blocks in every layer's K and V and nothing else; pairs that would
race or fall outside the cache are refused before anything is written."""
from __future__ import annotations

import pytest
import torch

from kernels.reference.copy_blocks import copy_blocks_reference
from tests.support.kernel_cases import BLOCK_SIZES, DTYPES, TRITON_DEVICES, randn, require_triton

PAIRS = [(0, 5), (3, 1), (7, 2), (4, 6)]


def random_cache(*, block_size, dtype, num_layers=3, num_blocks=8, num_kv_heads=2, head_dim=64,
                 device="cpu", seed=0):
    return randn(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype,
                 seed=seed, device=device)


def expected_after(kv_cache, pairs):
    expected = kv_cache.clone()
    for src, dst in pairs:
        for layer in range(kv_cache.shape[0]):
            for plane in range(2):
                expected[layer, plane, dst] = kv_cache[layer, plane, src]
    return expected


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_copies_each_pair_in_every_layer_and_plane(block_size, dtype):
    kv_cache = random_cache(block_size=block_size, dtype=dtype, seed=block_size)
    expected = expected_after(kv_cache, PAIRS)
    copy_blocks_reference(kv_cache, PAIRS)
    assert torch.equal(kv_cache, expected)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_copies_exactly_what_the_reference_copies(device, block_size, dtype):
    require_triton(device)
    from kernels.triton.copy_blocks import copy_blocks_triton

    kv_cache = random_cache(block_size=block_size, dtype=dtype, device=device, seed=block_size)
    expected = kv_cache.clone()
    copy_blocks_reference(expected, PAIRS)
    # Poison the targets, so a chunk the kernel skips shows as NaN.
    kv_cache[:, :, [dst for _, dst in PAIRS]] = float("nan")
    copy_blocks_triton(kv_cache, torch.tensor(PAIRS))
    assert torch.equal(kv_cache, expected)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_blocks_larger_than_one_chunk_are_copied_whole(device):
    """256 slots x 4 heads x 128 channels = 131072 elements per block: 32 programs each."""
    require_triton(device)
    from kernels.triton.copy_blocks import copy_blocks_triton

    kv_cache = random_cache(block_size=256, dtype=torch.float16, num_layers=2, num_blocks=3,
                            num_kv_heads=4, head_dim=128, device=device, seed=1)
    expected = expected_after(kv_cache, [(2, 0)])
    kv_cache[:, :, 0] = float("nan")
    copy_blocks_triton(kv_cache, [(2, 0)])
    assert torch.equal(kv_cache, expected)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_planes_past_32_bit_element_offsets(device):
    """2**21 + 8 blocks of 16 x 1 x 64 elements: the value plane starts past element 2**31.
    Only the blocks touched get pages of the 8.6 GB address range."""
    require_triton(device)
    from kernels.triton.copy_blocks import copy_blocks_triton

    num_blocks = (1 << 21) + 8
    kv_cache = torch.empty(1, 2, num_blocks, 16, 1, 64, dtype=torch.float16, device=device)
    src, dst = num_blocks - 1, num_blocks - 5
    kv_cache[:, :, src] = randn(1, 2, 16, 1, 64, dtype=torch.float16, seed=3, device=device)
    kv_cache[:, :, dst] = float("nan")
    copy_blocks_triton(kv_cache, [(src, dst)])
    assert torch.equal(kv_cache[:, :, dst], kv_cache[:, :, src])


@pytest.mark.parametrize("pairs, message", [
    ([(0, 8)], r"must lie in \[0, 8\)"),
    ([(-1, 2)], r"must lie in \[0, 8\)"),
    ([(0, 2), (1, 2)], "target of two copies"),
    ([(0, 2), (2, 3)], "both copied from and copied to"),
])
def test_unsafe_pairs_are_refused_before_anything_is_written(pairs, message):
    kv_cache = random_cache(block_size=16, dtype=torch.float32)
    before = kv_cache.clone()
    with pytest.raises(ValueError, match=message):
        copy_blocks_reference(kv_cache, pairs)
    assert torch.equal(kv_cache, before)


def test_no_pairs_is_a_no_op():
    kv_cache = random_cache(block_size=16, dtype=torch.float32)
    before = kv_cache.clone()
    copy_blocks_reference(kv_cache, [])
    assert torch.equal(kv_cache, before)
