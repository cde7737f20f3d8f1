"""Paged attention for prefill and extend: many new query tokens per sequence, causal, over the
paged cache that already holds the sequence's cached prefix and, written by store_kv just before,
the new tokens themselves (Triton).

Sequences arrive flattened: sequence s owns query rows query_start_loc[s] .. [s+1], and its
context is seq_lens[s] tokens, the last q_len of which are the new ones. A fresh prompt, a
chunk of a long prompt (chunked prefill) and the tail after a prefix-cache hit are all the same
case:

    context positions:  0 ........................ prefix-1 | prefix ........ seq_len-1
                        cached (earlier chunks / prefix hit) | this step's new tokens
    new token i sits at position prefix + i and sees positions 0 .. prefix + i.

One program takes BLOCK_Q new tokens of one sequence times the GQA group of one kv head, as
BLOCK_Q * GROUP_PAD rows of a single tile, so each K/V tile is loaded once for the whole group,
and stops at the last position its rows can see.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import check_output, check_prefill_args
from kernels.triton.paged_tile import attend_tile, paged_kv_offsets
from kernels.triton_support import dot_precision, next_power_of_2, upcast_dot

TILE = 64           # context tokens per inner iteration
ROWS = 64           # (query token, query head) rows per program
LOG2_E = 1.4426950408889634


# The integer arguments that vary between batches (the block tables' row stride; the others with
# the caller's views): int64 and never specialised, so every batch runs one compiled variant.
VARYING_INTEGERS = ("query_stride_token", "query_stride_head", "out_stride_token",
                    "out_stride_head", "block_tables_stride")


@triton.jit(do_not_specialize=VARYING_INTEGERS)
def _prefill_kernel(
    out_ptr,              # [num_tokens, num_q_heads, head_dim]
    query_ptr,            # [num_tokens, num_q_heads, head_dim]
    key_cache_ptr,        # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache_ptr,      # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    block_tables_ptr,     # [num_seqs, max_blocks_per_seq], int32/int64
    query_start_loc_ptr,  # [num_seqs + 1], int32/int64
    seq_lens_ptr,         # [num_seqs], int32/int64: context after this step
    scale_log2,           # softmax scale * log2(e)
    query_stride_token: tl.int64, query_stride_head: tl.int64,
    out_stride_token: tl.int64, out_stride_head: tl.int64,
    block_tables_stride: tl.int64,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    query_tile = tl.program_id(1)
    kv_head = tl.program_id(2).to(tl.int64)
    query_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    query_len = (tl.load(query_start_loc_ptr + seq + 1) - query_start).to(tl.int32)
    if query_tile * BLOCK_Q >= query_len:
        return  # the grid is sized for the longest sequence of the batch
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    prefix = seq_len - query_len

    row = tl.arange(0, BLOCK_Q * GROUP_PAD)
    query_index = query_tile * BLOCK_Q + row // GROUP_PAD   # among the sequence's new tokens
    member = row % GROUP_PAD
    row_mask = (query_index < query_len) & (member < GROUP)
    head = kv_head * GROUP + member
    token = query_start + query_index
    channel = tl.arange(0, HEAD_DIM_PAD)
    channel_mask = channel < HEAD_DIM
    io_mask = row_mask[:, None] & channel_mask[None, :]
    query = tl.load(query_ptr + token[:, None] * query_stride_token
                    + head[:, None] * query_stride_head + channel[None, :],
                    mask=io_mask, other=0.0)
    if UPCAST_DOT:
        query = query.to(tl.float32)
    query_pos = prefix + query_index

    running_max = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    table_row = block_tables_ptr + seq * block_tables_stride
    kv_end = tl.minimum(seq_len, prefix + (query_tile + 1) * BLOCK_Q)
    for tile_start in range(0, kv_end, TILE):
        kv_pos = tile_start + tl.arange(0, TILE)
        kv_pos_mask = kv_pos < kv_end
        kv_offset = paged_kv_offsets(table_row, kv_pos, kv_pos_mask, kv_head, channel,
                                     NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        # Position 0 is visible to every row and lies in the first tile.
        visible = (kv_pos[None, :] <= query_pos[:, None]) & kv_pos_mask[None, :]
        running_max, running_sum, acc = attend_tile(
            query, key_cache_ptr, value_cache_ptr, kv_offset,
            kv_pos_mask[:, None] & channel_mask[None, :], visible,
            running_max, running_sum, acc, scale_log2, UPCAST_DOT, DOT_PRECISION)

    result = acc / running_sum[:, None]
    tl.store(out_ptr + token[:, None] * out_stride_token + head[:, None] * out_stride_head
             + channel[None, :], result.to(out_ptr.dtype.element_ty), mask=io_mask)


def paged_prefill_attention_triton(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
    scale: float, *, max_query_len: int | None = None, max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of every new token over its sequence's paged context (see the module
    docstring). `max_query_len` / `max_seq_len`, when the caller knows them, save device syncs."""
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if seq_lens.numel() else 0
    group = check_prefill_args(query, key_cache, value_cache, block_tables, query_start_loc,
                               seq_lens, max_seq_len)
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) \
            if seq_lens.numel() else 0
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or max_query_len == 0:
        return out
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    group_pad = next_power_of_2(group)
    block_q = max(1, ROWS // group_pad)
    _prefill_kernel[(num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)](
        out, query, key_cache, value_cache, block_tables, query_start_loc, seq_lens,
        scale * LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, next_power_of_2(head_dim)),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q,
        BLOCK_SIZE=key_cache.shape[1], TILE=TILE,
        UPCAST_DOT=upcast_dot(query.dtype), DOT_PRECISION=dot_precision(query.dtype),
        num_warps=4,
    )
    return out
