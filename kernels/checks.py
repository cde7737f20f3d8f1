"""Argument checks shared by each kernel's Triton launcher and its torch reference, so both
refuse the same inputs with the same message instead of reading out of bounds."""
from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SUPPORTED_BLOCK_SIZES = (16, 32, 64, 128, 256)


def check_block_size(block_size: int) -> None:
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block size {block_size} is not one of {SUPPORTED_BLOCK_SIZES}")


def check_cache_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"KV cache dtype {dtype} is not one of {SUPPORTED_DTYPES}")


def check_layer_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Both caches of a layer: same shape, dtype and device, and laid out as `kv_cache` says."""
    if key_cache.dim() != 4:
        raise ValueError("a layer's cache is [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got shape {tuple(key_cache.shape)}")
    if key_cache.shape != value_cache.shape or key_cache.dtype != value_cache.dtype \
            or key_cache.device != value_cache.device:
        raise ValueError("key and value caches differ in shape, dtype or device: "
                         f"{tuple(key_cache.shape)} {key_cache.dtype} {key_cache.device} vs "
                         f"{tuple(value_cache.shape)} {value_cache.dtype} {value_cache.device}")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("a layer's key and value caches must be contiguous")
    check_block_size(key_cache.shape[1])
    check_cache_dtype(key_cache.dtype)


def check_index(name: str, tensor: torch.Tensor, dims: int, device: torch.device) -> None:
    """Integer index tensors (block tables, lengths, slot mappings) live beside the cache."""
    if tensor.dim() != dims or tensor.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a {dims}-d int32/int64 tensor, "
                         f"got {tensor.dtype} of shape {tuple(tensor.shape)}")
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, the cache on {device}")


def check_store_kv_args(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    check_layer_caches(key_cache, value_cache)
    expected = (slot_mapping.shape[0] if slot_mapping.dim() == 1 else -1,
                key_cache.shape[2], key_cache.shape[3])
    for name, tensor in (("key", key), ("value", value)):
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name} must be [num_tokens, num_kv_heads, head_dim] = {expected}, "
                             f"got {tuple(tensor.shape)}")
        if tensor.dtype != key_cache.dtype or tensor.device != key_cache.device:
            raise ValueError(f"{name} is {tensor.dtype} on {tensor.device}, the cache "
                             f"{key_cache.dtype} on {key_cache.device}")
        if tensor.stride(2) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous")
    check_index("slot_mapping", slot_mapping, 1, key_cache.device)


def check_query(query: torch.Tensor, key_cache: torch.Tensor) -> int:
    """A query `[tokens, num_q_heads, head_dim]` that fits the cache; returns the GQA group size
    (query heads per kv head)."""
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    if query.dim() != 3 or query.shape[2] != head_dim:
        raise ValueError(f"query must be [tokens, num_q_heads, {head_dim}], "
                         f"got {tuple(query.shape)}")
    if query.shape[1] % num_kv_heads:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {num_kv_heads} "
                         "kv heads")
    if query.dtype != key_cache.dtype or query.device != key_cache.device:
        raise ValueError(f"query is {query.dtype} on {query.device}, the cache "
                         f"{key_cache.dtype} on {key_cache.device}")
    if query.stride(2) != 1:
        raise ValueError("the query's last dimension must be contiguous")
    return query.shape[1] // num_kv_heads


def check_output(out: torch.Tensor, query: torch.Tensor) -> None:
    if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(f"out must match the query: {tuple(query.shape)} {query.dtype} on "
                         f"{query.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    if out.stride(2) != 1:
        raise ValueError("out's last dimension must be contiguous")


def check_block_tables(block_tables: torch.Tensor, num_seqs: int, key_cache: torch.Tensor,
                       max_context_len: int) -> None:
    """Rows of block ids, one per sequence, long enough for the longest context."""
    check_index("block_tables", block_tables, 2, key_cache.device)
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} "
                         "sequences")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables rows must be contiguous")
    capacity = block_tables.shape[1] * key_cache.shape[1]
    if max_context_len > capacity:
        raise ValueError(f"a context of {max_context_len} tokens needs more than the "
                         f"{block_tables.shape[1]} blocks of {key_cache.shape[1]} slots a "
                         "block_tables row holds")


def check_decode_args(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, context_lens: torch.Tensor,
                      max_context_len: int) -> int:
    """Returns the GQA group size."""
    check_layer_caches(key_cache, value_cache)
    group = check_query(query, key_cache)
    check_index("context_lens", context_lens, 1, key_cache.device)
    if context_lens.shape[0] != query.shape[0]:
        raise ValueError(f"{context_lens.shape[0]} context lengths for {query.shape[0]} queries")
    check_block_tables(block_tables, query.shape[0], key_cache, max_context_len)
    return group


def check_prefill_args(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                       seq_lens: torch.Tensor, max_seq_len: int) -> int:
    """Returns the GQA group size. The lengths' values are the caller's promise (checking them
    would cost a device sync): query_start_loc ascends from 0 to the token count, and each
    sequence's new tokens are the last of its seq_lens tokens."""
    check_layer_caches(key_cache, value_cache)
    group = check_query(query, key_cache)
    check_index("query_start_loc", query_start_loc, 1, key_cache.device)
    check_index("seq_lens", seq_lens, 1, key_cache.device)
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1:
        raise ValueError(f"query_start_loc needs num_seqs + 1 = {seq_lens.shape[0] + 1} "
                         f"entries, got {query_start_loc.shape[0]}")
    check_block_tables(block_tables, seq_lens.shape[0], key_cache, max_seq_len)
    return group


def check_kv_cache(kv_cache: torch.Tensor) -> None:
    """A whole model's cache, `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`."""
    if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
        raise ValueError("the KV cache is [num_layers, 2, num_blocks, block_size, num_kv_heads, "
                         f"head_dim], got shape {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError("the KV cache must be contiguous")
    check_block_size(kv_cache.shape[3])
    check_cache_dtype(kv_cache.dtype)


def block_pairs_tensor(block_pairs, num_blocks: int) -> torch.Tensor:
    """(src, dst) copies as an int64 `[pairs, 2]` CPU tensor, checked on the host where the
    allocator's answer arrives: ids in range, no block written twice, none both read and
    written (copies run in parallel, so a chain would race)."""
    pairs = torch.as_tensor(block_pairs, dtype=torch.int64, device="cpu").reshape(-1, 2)
    if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= num_blocks):
        raise ValueError(f"block copy ids must lie in [0, {num_blocks}), got "
                         f"{pairs.min().item()}..{pairs.max().item()}")
    sources, targets = pairs[:, 0].tolist(), pairs[:, 1].tolist()
    if len(set(targets)) != len(targets):
        raise ValueError("a block is the target of two copies")
    if set(sources) & set(targets):
        raise ValueError("a block is both copied from and copied to in one batch")
    return pairs
