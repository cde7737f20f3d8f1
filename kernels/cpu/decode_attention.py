"""Paged decode attention for serving on the CPU: sequences of similar context length batched
into one matmul each, instead of one small matmul per sequence.

The per-sequence reference spends most of a CPU decode step in Python and in tiny kernels (a
128-sequence step ran 4 x 128 of each per layer set). Padding the whole batch to its longest
context is no answer either: chat traffic mixes a few 1,000-token contexts with many 100-token
ones, so most of the padded work would be padding. So the rows are sorted by context length and
cut into buckets whose padding stays under BUCKET_SLACK of their real blocks; each bucket gathers
its blocks in one indexing op and attends with two batched matmuls.

Results equal the reference's up to fp32 summation order (tests/kernels/test_kernel_decode_attention.py).
"""
from __future__ import annotations

import torch

from kernels.checks import check_decode_args, check_output

# A bucket may hold at most this many padded blocks per real one.
BUCKET_SLACK = 1.25
# And at most this many context tokens in all, so one bucket's fp32 K/V copies stay a few MiB
# per head channel rather than growing with the batch.
BUCKET_MAX_TOKENS = 1 << 16


def paged_decode_attention_cpu(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
    max_context_len: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as kernels.triton.decode_attention.paged_decode_attention_triton."""
    lengths = context_lens.tolist()
    check_decode_args(query, key_cache, value_cache, block_tables, context_lens,
                      max(lengths, default=0) if max_context_len is None
                      else max_context_len)
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    block_size = key_cache.shape[1]
    for rows in length_buckets(lengths, block_size):
        attend_bucket(query, key_cache, value_cache, block_tables, lengths, rows, scale, out)
    for row, length in enumerate(lengths):
        if length == 0:   # a padding row: defined to give zeros
            out[row] = 0
    return out


def length_buckets(lengths: list[int], block_size: int) -> list[list[int]]:
    """The rows with a context, longest first, cut where adding the next row would pad the
    bucket past BUCKET_SLACK or BUCKET_MAX_TOKENS. Each bucket's first row is its widest."""
    order = sorted((row for row, length in enumerate(lengths) if length > 0),
                   key=lambda row: -lengths[row])
    buckets: list[list[int]] = []
    width = real_blocks = 0
    for row in order:
        blocks = -(-lengths[row] // block_size)
        if buckets and width * (len(buckets[-1]) + 1) <= BUCKET_SLACK * (real_blocks + blocks) \
                and width * block_size * (len(buckets[-1]) + 1) <= BUCKET_MAX_TOKENS:
            buckets[-1].append(row)
            real_blocks += blocks
        else:
            buckets.append([row])
            width, real_blocks = blocks, blocks
    return buckets


def attend_bucket(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                  block_tables: torch.Tensor, lengths: list[int], rows: list[int],
                  scale: float, out: torch.Tensor) -> None:
    """fp32 attention of the bucket's query rows over their first `width` blocks, positions at
    or past each row's length masked out. Table entries past a row's last block may be -1;
    they are read as block 0 and masked like any other padding."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    count = len(rows)
    group = query.shape[1] // num_kv_heads
    width = -(-lengths[rows[0]] // block_size)
    index = torch.tensor(rows, device=query.device)
    tables = block_tables[index, :width].long().clamp_(min=0)
    span = width * block_size
    # [count, kv_heads, span, head_dim]: each row's context, kv head major for the matmuls.
    keys = key_cache[tables].view(count, span, num_kv_heads, head_dim).transpose(1, 2).float()
    values = value_cache[tables].view(count, span, num_kv_heads, head_dim).transpose(1, 2) \
        .float()
    grouped = query[index].float().view(count, num_kv_heads, group, head_dim)
    scores = grouped @ keys.transpose(2, 3) * scale                # [count, kv, group, span]
    lens = torch.tensor([lengths[row] for row in rows], device=query.device)
    past_end = torch.arange(span, device=query.device)[None, :] >= lens[:, None]
    scores.masked_fill_(past_end[:, None, None, :], float("-inf"))
    # Padding slots hold whatever the cache held (never-written memory can be NaN), and a zero
    # probability times NaN is still NaN: the padding of the gathered copy (indexing copies) is
    # zeroed.
    values.masked_fill_(past_end[:, None, :, None], 0)
    result = torch.softmax(scores, dim=-1) @ values                # [count, kv, group, d]
    out[index] = result.view(count, num_kv_heads * group, head_dim).to(out.dtype)
