"""Paged attention for decode: one query token per sequence over its paged context (Triton).

Flash-decoding: the context is cut into partitions, each (sequence, kv head, partition) is one
program, so a batch of one long sequence still spreads over every SM. A program loads the
query heads of its GQA group once (they share the kv head, so each K/V tile is read once for
the whole group), walks its partition in tiles with an online softmax, and leaves an
unnormalised partial result plus its running max and sum; a second kernel merges the
partitions. When every context fits one partition the first kernel writes the output directly.

    context:  |---- partition 0 ----|---- partition 1 ----|-- 2 --|
    tiles:    |tile|tile|tile|tile  |tile|tile|tile|tile  |tile|  .   (TILE tokens each; a tile
                                                                      may span several blocks)
    token t lives in block block_tables[seq, t // block_size], slot t % block_size.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import check_decode_args, check_output
from kernels.triton.paged_tile import attend_tile, paged_kv_offsets
from kernels.triton_support import (
    dot_precision,
    multiprocessor_count,
    next_power_of_2,
    upcast_dot,
)

TILE = 64                 # context tokens per inner iteration
MIN_PARTITION = 256       # below this the merge costs more than the extra parallelism brings
MAX_PARTITIONS = 64       # the merge kernel holds every partition of a row in registers
PROGRAMS_PER_SM = 4       # enough resident programs per SM to hide memory latency
LOG2_E = 1.4426950408889634


@triton.jit
def _decode_partition_kernel(
    out_ptr,              # [num_seqs, num_q_heads, head_dim]; written when SINGLE_PARTITION
    partial_out_ptr,      # [num_seqs, num_q_heads, max_partitions, HEAD_DIM_PAD] fp32
    partial_max_ptr,      # [num_seqs, num_q_heads, max_partitions] fp32, log2 domain
    partial_sum_ptr,      # [num_seqs, num_q_heads, max_partitions] fp32
    query_ptr,            # [num_seqs, num_q_heads, head_dim]
    key_cache_ptr,        # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache_ptr,      # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    block_tables_ptr,     # [num_seqs, max_blocks_per_seq], int32/int64
    context_lens_ptr,     # [num_seqs], int32/int64
    scale_log2,           # softmax scale * log2(e): exp2 is the native instruction
    query_stride_seq, query_stride_head,
    out_stride_seq, out_stride_head,
    block_tables_stride,
    max_partitions,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, PARTITION: tl.constexpr,
    SINGLE_PARTITION: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    partition = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    # A partition past the end of a short context runs no tile; the merge kernel never reads it.
    start = partition * PARTITION
    end = tl.minimum(start + PARTITION, context_len)

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

    if SINGLE_PARTITION:
        # An empty context (a padding row) leaves acc and the sum at zero: write zeros.
        result = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
        tl.store(out_ptr + seq * out_stride_seq + head[:, None] * out_stride_head
                 + channel[None, :], result.to(out_ptr.dtype.element_ty),
                 mask=head_mask[:, None] & channel_mask[None, :])
    else:
        stat = (seq * (NUM_KV_HEADS * GROUP) + head) * max_partitions + partition
        tl.store(partial_max_ptr + stat, running_max, mask=head_mask)
        tl.store(partial_sum_ptr + stat, running_sum, mask=head_mask)
        tl.store(partial_out_ptr + stat[:, None] * HEAD_DIM_PAD + channel[None, :], acc,
                 mask=head_mask[:, None])


@triton.jit
def _decode_merge_kernel(
    out_ptr,              # [num_seqs, num_q_heads, head_dim]
    partial_out_ptr,      # [num_seqs, num_q_heads, max_partitions, HEAD_DIM_PAD] fp32
    partial_max_ptr,      # [num_seqs, num_q_heads, max_partitions] fp32
    partial_sum_ptr,      # [num_seqs, num_q_heads, max_partitions] fp32
    context_lens_ptr,     # [num_seqs]
    out_stride_seq, out_stride_head,
    max_partitions,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PARTITION: tl.constexpr, PARTITIONS_PAD: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    num_partitions = tl.cdiv(context_len, PARTITION)
    part = tl.arange(0, PARTITIONS_PAD)
    part_mask = part < num_partitions
    stat = (seq * NUM_Q_HEADS + head) * max_partitions + part
    part_max = tl.load(partial_max_ptr + stat, mask=part_mask, other=float("-inf"))
    overall_max = tl.max(part_max, axis=0)
    overall_max = tl.where(num_partitions > 0, overall_max, 0.0)
    weight = tl.where(part_mask, tl.exp2(part_max - overall_max), 0.0)
    total = tl.sum(tl.load(partial_sum_ptr + stat, mask=part_mask, other=0.0) * weight, axis=0)
    channel = tl.arange(0, HEAD_DIM_PAD)
    partial = tl.load(partial_out_ptr + stat[:, None] * HEAD_DIM_PAD + channel[None, :],
                      mask=part_mask[:, None], other=0.0)
    result = tl.sum(partial * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * out_stride_seq + head * out_stride_head + channel,
             result.to(out_ptr.dtype.element_ty), mask=channel < HEAD_DIM)


def choose_partition(num_seqs: int, num_kv_heads: int, max_context_len: int,
                     device: torch.device) -> int:
    """Tokens per partition: split just enough to give every SM a few programs, never into
    partitions under MIN_PARTITION tokens nor into more than MAX_PARTITIONS. A power of two, so
    only a handful of kernel variants ever compile."""
    programs_unsplit = max(1, num_seqs * num_kv_heads)
    wanted = -(-PROGRAMS_PER_SM * multiprocessor_count(device) // programs_unsplit)
    partition = next_power_of_2(-(-max_context_len // max(1, wanted)))
    floor = max(MIN_PARTITION, next_power_of_2(-(-max_context_len // MAX_PARTITIONS)))
    return max(partition, floor)


def paged_decode_attention_triton(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
    max_context_len: int | None = None, partition_size: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[s, h] = softmax(scale * q[s, h] · K[s]ᵀ) V[s] over the first context_lens[s] tokens
    of sequence s's blocks, K/V read from kv head h // (query heads per kv head). A context of 0
    gives zeros. `max_context_len` (≥ every context length) saves a device sync when given;
    `partition_size` (a power of two ≥ TILE) overrides the heuristic."""
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
    partition = partition_size or choose_partition(num_seqs, num_kv_heads, max_context_len,
                                                   query.device)
    if partition < TILE or partition & (partition - 1):
        raise ValueError(f"partition_size must be a power of two >= {TILE}, got {partition}")
    max_partitions = max(1, -(-max_context_len // partition))
    if max_partitions > MAX_PARTITIONS:
        raise ValueError(f"{max_partitions} partitions of {partition} tokens exceed the "
                         f"{MAX_PARTITIONS} the merge kernel holds")
    single = max_partitions == 1
    head_dim_pad = max(16, next_power_of_2(head_dim))
    partial_shape = (num_seqs, num_q_heads, 0 if single else max_partitions)
    partial_out = query.new_empty(partial_shape + (head_dim_pad,), dtype=torch.float32)
    partial_max = query.new_empty(partial_shape, dtype=torch.float32)
    partial_sum = query.new_empty(partial_shape, dtype=torch.float32)

    _decode_partition_kernel[(num_seqs, num_kv_heads, max_partitions)](
        out, partial_out, partial_max, partial_sum, query, key_cache, value_cache,
        block_tables, context_lens, scale * LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        max_partitions,
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        GROUP=group, GROUP_PAD=max(16, next_power_of_2(group)),
        BLOCK_SIZE=block_size, TILE=TILE, PARTITION=partition, SINGLE_PARTITION=single,
        UPCAST_DOT=upcast_dot(query.dtype), DOT_PRECISION=dot_precision(query.dtype),
        num_warps=4,
    )
    if not single:
        _decode_merge_kernel[(num_seqs, num_q_heads)](
            out, partial_out, partial_max, partial_sum, context_lens,
            out.stride(0), out.stride(1), max_partitions,
            NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            PARTITION=partition, PARTITIONS_PAD=next_power_of_2(max_partitions),
            num_warps=4,
        )
    return out
