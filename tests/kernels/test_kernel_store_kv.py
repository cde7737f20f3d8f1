"""store_kv writes exactly the slots it is given (padding slots skipped) and nothing else; the
reference against a token-by-token loop, the CPU and Triton kernels against the reference."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu.store_kv import store_kv_cpu
from kernels.reference.store_kv import store_kv_reference
from tests.support.kernel_cases import BLOCK_SIZES, DTYPES, TRITON_DEVICES, randn, require_triton


def store_case(*, block_size, dtype, num_blocks=9, num_kv_heads=3, head_dim=64, num_tokens=40,
               device="cpu", seed=0, huge=False):
    """New K/V as slices of a fused [tokens, q + k + v heads, head_dim] projection (not
    contiguous per token), random distinct slots with every fifth token padding (-1)."""
    fused = randn(num_tokens, 4 + 2 * num_kv_heads, head_dim, dtype=dtype, seed=seed,
                  device=device)
    key, value = fused[:, 4:4 + num_kv_heads], fused[:, 4 + num_kv_heads:]
    first_slot = (num_blocks - 4) * block_size if huge else 0
    candidates = torch.arange(first_slot, num_blocks * block_size)
    order = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))
    slots = candidates[order[:num_tokens]]
    slots[::5] = -1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if huge:  # only the blocks that are written get pages
        key_cache = torch.empty(shape, dtype=dtype, device=device)
        value_cache = torch.empty(shape, dtype=dtype, device=device)
        key_cache[-4:] = randn(4, *shape[1:], dtype=dtype, seed=seed + 1, device=device)
        value_cache[-4:] = randn(4, *shape[1:], dtype=dtype, seed=seed + 2, device=device)
    else:
        key_cache = randn(*shape, dtype=dtype, seed=seed + 1, device=device)
        value_cache = randn(*shape, dtype=dtype, seed=seed + 2, device=device)
    return key, value, key_cache, value_cache, slots.to(device)


def expected_caches(key, value, key_cache, value_cache, slots):
    """Token by token, in plain Python: slot s is row s % block_size of block s // block_size."""
    block_size = key_cache.shape[1]
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            key_cache[slot // block_size, slot % block_size] = key[token]
            value_cache[slot // block_size, slot % block_size] = value[token]
    return key_cache, value_cache


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_writes_each_token_to_its_slot_and_nothing_else(block_size, dtype):
    key, value, key_cache, value_cache, slots = store_case(block_size=block_size, dtype=dtype,
                                                           seed=block_size)
    expected_key, expected_value = expected_caches(key, value, key_cache, value_cache, slots)
    store_kv_reference(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_key)
    assert torch.equal(value_cache, expected_value)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_padding", [True, False])
def test_cpu_kernel_writes_exactly_what_the_reference_writes(block_size, dtype, with_padding):
    key, value, key_cache, value_cache, slots = store_case(block_size=block_size, dtype=dtype,
                                                           seed=block_size + 7)
    if not with_padding:  # the engine's case: the fast path with no filtering
        key, value, slots = key[slots >= 0], value[slots >= 0], slots[slots >= 0]
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    store_kv_reference(key, value, expected_key, expected_value, slots)
    store_kv_cpu(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_key)
    assert torch.equal(value_cache, expected_value)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads, head_dim", [(1, 64), (3, 64), (8, 128)])
def test_triton_writes_exactly_what_the_reference_writes(device, block_size, dtype,
                                                         num_kv_heads, head_dim):
    require_triton(device)
    case = store_case(block_size=block_size, dtype=dtype, num_kv_heads=num_kv_heads,
                      head_dim=head_dim, device=device, seed=block_size + num_kv_heads)
    key, value, key_cache, value_cache, slots = case
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    store_kv_reference(key, value, expected_key, expected_value, slots)
    # Poison the slots to be written, so a skipped write shows as NaN.
    written = slots[slots >= 0].long()
    key_cache.view(-1, num_kv_heads, head_dim)[written] = float("nan")
    value_cache.view(-1, num_kv_heads, head_dim)[written] = float("nan")
    from kernels.triton.store_kv import store_kv_triton

    store_kv_triton(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_key)
    assert torch.equal(value_cache, expected_value)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_slots_past_32_bit_element_offsets(device):
    """Slots in blocks above 2**21 (16 slots x 1 head x 64 channels each) lie past element
    2**31 of a 4.3 GB cache whose untouched pages are never allocated."""
    require_triton(device)
    num_blocks = (1 << 21) + 64
    key, value, key_cache, value_cache, slots = store_case(
        block_size=16, dtype=torch.float16, num_blocks=num_blocks, num_kv_heads=1,
        num_tokens=30, device=device, seed=5, huge=True)
    assert int(slots.max()) * 64 > 2 ** 31
    top_key, top_value = key_cache[-4:].clone(), value_cache[-4:].clone()
    from kernels.triton.store_kv import store_kv_triton

    store_kv_triton(key, value, key_cache, value_cache, slots)
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            block, offset = divmod(slot - (num_blocks - 4) * 16, 16)
            top_key[block, offset], top_value[block, offset] = key[token], value[token]
    assert torch.equal(key_cache[-4:], top_key)
    assert torch.equal(value_cache[-4:], top_value)


def test_mismatched_arguments_are_refused_with_a_message():
    key, value, key_cache, value_cache, slots = store_case(block_size=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="key must be"):
        store_kv_reference(key[:, :2], value, key_cache, value_cache, slots)
    with pytest.raises(ValueError, match="value is torch.float16"):
        store_kv_reference(key, value.half(), key_cache, value_cache, slots)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        store_kv_reference(key, value, key_cache, value_cache, slots.float())
