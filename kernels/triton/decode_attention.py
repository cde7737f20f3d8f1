"""Paged attention for decode: one query token per sequence over its paged context (Triton).

Flash-decoding with a fixed number of segments. Each sequence's context is cut into SEGMENTS
equal segments (a whole number of TILE-token tiles each); each (sequence, kv head, segment) is
one program, so a batch of one long sequence still spreads over the SMs. A program loads the
query heads of its GQA group once (they share the kv head, so each K/V tile is read once for the
whole group), walks its segment in tiles with an online softmax, and leaves an unnormalised
partial result plus its running max and sum; a second kernel merges the segments.

    context (1000 tokens):  |seg 0|seg 1| ... |seg 15|   16 segments of 64 tokens (one tile)
    context (100 tokens):   |seg 0 |seg 1|  -  -  -  |   2 segments of 64; the rest stay empty
    token t lives in block block_tables[seq, t // block_size], slot t % block_size.

Why fixed: the segment length is worked out on the device from each sequence's own length, so
nothing about the launch depends on the batch's contexts. The grid depends only on the batch
size and every constexpr only on the model, so one compiled variant serves every batch (no
compile stalls while serving, docs/kernels.md) and a CUDA graph captured for a batch size stays
right whatever the contexts are at replay. The integer arguments that change from batch to batch
(the block tables' row stride) are int64 and not specialised, for the same reason.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import check_decode_args, check_output
from kernels.triton.paged_tile import attend_tile, paged_kv_offsets
from kernels.triton_support import dot_precision, next_power_of_2, upcast_dot

TILE = 64                 # context tokens per inner iteration
# Segments per sequence: 16 fills an H100/H200 (132 SMs) about 4 programs deep from 8 sequences
# of 4 kv heads; a large batch has programs enough anyway, and its short segments end early.
SEGMENTS = 16
LOG2_E = 1.4426950408889634
# The integer arguments that vary between batches: declared int64 and never specialised (Triton
# would otherwise compile a variant per stride divisible by 16 or not).
VARYING_INTEGERS = ("query_stride_seq", "query_stride_head", "out_stride_seq", "out_stride_head",
                    "block_tables_stride")


@triton.jit
def segment_length(context_len, SEGMENTS: tl.constexpr, TILE: tl.constexpr):
    """Tokens per segment of a context: a whole number of tiles, so that SEGMENTS of them cover
    it; a short context fills only its first few segments."""
    tiles = tl.cdiv(context_len, TILE)
    return tl.cdiv(tiles, SEGMENTS) * TILE


@triton.jit(do_not_specialize=VARYING_INTEGERS)
def _decode_segment_kernel(
    partial_out_ptr,      # [num_seqs, num_q_heads, SEGMENTS, HEAD_DIM_PAD] fp32
    partial_max_ptr,      # [num_seqs, num_q_heads, SEGMENTS] fp32, log2 domain
    partial_sum_ptr,      # [num_seqs, num_q_heads, SEGMENTS] fp32
    query_ptr,            # [num_seqs, num_q_heads, head_dim]
    key_cache_ptr,        # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache_ptr,      # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    block_tables_ptr,     # [num_seqs, max_blocks_per_seq], int32/int64
    context_lens_ptr,     # [num_seqs], int32/int64
    scale_log2,           # softmax scale * log2(e): exp2 is the native instruction
    query_stride_seq: tl.int64, query_stride_head: tl.int64,
    block_tables_stride: tl.int64,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, SEGMENTS: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    segment = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    length = segment_length(context_len, SEGMENTS, TILE)
    start = segment * length
    if start >= context_len:
        return  # past the end of a short context (or a padding row): the merge skips it
    end = tl.minimum(start + length, context_len)

    member = tl.arange(0, GROUP_PAD)
    head = kv_head * GROUP + member                      # query heads sharing this kv head
    channel = tl.arange(0, HEAD_DIM_PAD)
    channel_mask = channel < HEAD_DIM
    head_mask = member < GROUP
    query = tl.load(query_ptr + seq * query_stride_seq + head[:, None] * query_stride_head
                    + channel[None, :], mask=head_mask[:, None] & channel_mask[None, :], other=0.0)
    if UPCAST_DOT:
        query = query.to(tl.float32)

    running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    table_row = block_tables_ptr + seq * block_tables_stride
    for tile_start in range(start, end, TILE):
        token = tile_start + tl.arange(0, TILE)
        token_mask = token < end
        kv_offset = paged_kv_offsets(table_row, token, token_mask, kv_head, channel,
                                     NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        # Every tile holds at least one real token, which every query head sees.
        running_max, running_sum, acc = attend_tile(
            query, key_cache_ptr, value_cache_ptr, kv_offset,
            token_mask[:, None] & channel_mask[None, :], token_mask[None, :],
            running_max, running_sum, acc, scale_log2, UPCAST_DOT, DOT_PRECISION)

    stat = (seq * (NUM_KV_HEADS * GROUP) + head) * SEGMENTS + segment
    tl.store(partial_max_ptr + stat, running_max, mask=head_mask)
    tl.store(partial_sum_ptr + stat, running_sum, mask=head_mask)
    tl.store(partial_out_ptr + stat[:, None] * HEAD_DIM_PAD + channel[None, :], acc,
             mask=head_mask[:, None])


@triton.jit(do_not_specialize=VARYING_INTEGERS)
def _decode_merge_kernel(
    out_ptr,              # [num_seqs, num_q_heads, head_dim]
    partial_out_ptr,      # [num_seqs, num_q_heads, SEGMENTS, HEAD_DIM_PAD] fp32
    partial_max_ptr,      # [num_seqs, num_q_heads, SEGMENTS] fp32
    partial_sum_ptr,      # [num_seqs, num_q_heads, SEGMENTS] fp32
    context_lens_ptr,     # [num_seqs]
    out_stride_seq: tl.int64, out_stride_head: tl.int64,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    TILE: tl.constexpr, SEGMENTS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    # The segments the first kernel wrote; none for an empty context (a padding row).
    written = tl.cdiv(context_len, tl.maximum(segment_length(context_len, SEGMENTS, TILE), 1))
    segment = tl.arange(0, SEGMENTS)
    segment_mask = segment < written
    stat = (seq * NUM_Q_HEADS + head) * SEGMENTS + segment
    segment_max = tl.load(partial_max_ptr + stat, mask=segment_mask, other=float("-inf"))
    overall_max = tl.max(segment_max, axis=0)
    overall_max = tl.where(written > 0, overall_max, 0.0)
    weight = tl.where(segment_mask, tl.exp2(segment_max - overall_max), 0.0)
    total = tl.sum(tl.load(partial_sum_ptr + stat, mask=segment_mask, other=0.0) * weight,
                   axis=0)
    channel = tl.arange(0, HEAD_DIM_PAD)
    partial = tl.load(partial_out_ptr + stat[:, None] * HEAD_DIM_PAD + channel[None, :],
                      mask=segment_mask[:, None], other=0.0)
    # An empty context leaves the total at zero: write zeros, never NaN.
    result = tl.sum(partial * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * out_stride_seq + head * out_stride_head + channel,
             result.to(out_ptr.dtype.element_ty), mask=channel < HEAD_DIM)


def paged_decode_attention_triton(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
    max_context_len: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[s, h] = softmax(scale * q[s, h] · K[s]ᵀ) V[s] over the first context_lens[s] tokens
    of sequence s's blocks, K/V read from kv head h // (query heads per kv head). A context of 0
    gives zeros. `max_context_len` (≥ every context length) is only checked against the block
    tables' width, and saves the device sync of finding it; the launch never depends on it."""
    if max_context_len is None:
        max_context_len = int(context_lens.max()) if context_lens.numel() else 0
    group = check_decode_args(query, key_cache, value_cache, block_tables, context_lens,
                              max_context_len)
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    num_seqs, num_q_heads, head_dim = query.shape
    if num_seqs == 0:
        return out
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    head_dim_pad = max(16, next_power_of_2(head_dim))
    partial_shape = (num_seqs, num_q_heads, SEGMENTS)
    partial_out = query.new_empty(partial_shape + (head_dim_pad,), dtype=torch.float32)
    partial_max = query.new_empty(partial_shape, dtype=torch.float32)
    partial_sum = query.new_empty(partial_shape, dtype=torch.float32)

    _decode_segment_kernel[(num_seqs, num_kv_heads, SEGMENTS)](
        partial_out, partial_max, partial_sum, query, key_cache, value_cache,
        block_tables, context_lens, scale * LOG2_E,
        query.stride(0), query.stride(1), block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        GROUP=group, GROUP_PAD=max(16, next_power_of_2(group)),
        BLOCK_SIZE=block_size, TILE=TILE, SEGMENTS=SEGMENTS,
        UPCAST_DOT=upcast_dot(query.dtype), DOT_PRECISION=dot_precision(query.dtype),
        num_warps=4,
    )
    _decode_merge_kernel[(num_seqs, num_q_heads)](
        out, partial_out, partial_max, partial_sum, context_lens,
        out.stride(0), out.stride(1),
        NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        TILE=TILE, SEGMENTS=SEGMENTS,
        num_warps=4,
    )
    return out
