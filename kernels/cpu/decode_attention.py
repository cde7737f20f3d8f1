"""Paged decode attention for serving on the CPU: sequences of similar context length batched
into a few matmuls, their blocks gathered into a reused workspace.

The per-sequence reference spends most of a CPU decode step in Python and in tiny kernels.
Padding the whole batch to its longest context is no answer either: chat traffic mixes a few
1,000-token contexts with many 100-token ones, so most of the padded work would be padding. So
the rows are sorted by context length and cut into buckets whose padding stays under
BUCKET_SLACK of their real blocks, and each bucket is one gather plus two batched matmuls per
kv head.

Where the time goes is memory, not arithmetic: a decode step reads every context's K and V once
and does a few multiply-adds per element read. So each bucket touches its bytes as few times as
possible (64 sequences of ~160 tokens on one thread, the embedded model's shapes: 2.2 ms a layer
before, 0.84 ms after; docs/kernels.md):
- the gather is `index_select` of whole blocks into a workspace kept across calls (advanced
  indexing copied element by element, 5x slower, and a fresh tensor of a few MiB each call
  paid a page fault per 4 KiB page it touched);
- the matmuls read one kv head's K or V straight out of the gathered [rows, tokens, kv_heads,
  head_dim] copy as a strided matrix (BLAS takes a row stride), instead of transposing it
  head-major first, which was a second full copy;
- a bucket holds at most BUCKET_MAX_BYTES of gathered K and V, so the matmuls read it from the
  cache the gather just wrote it to, not from memory again.

Results equal the reference's up to fp32 summation order (tests/kernels/test_kernel_decode_attention.py).
"""
from __future__ import annotations

import threading

import torch

from kernels.checks import check_decode_args, check_output

# A bucket may hold at most this many padded blocks per real one.
BUCKET_SLACK = 1.25
# And at most this many bytes of gathered K and V (fp32), unless one row alone is larger: about
# what a core's share of the last-level cache holds.
BUCKET_MAX_BYTES = 4 << 20


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
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    token_bytes = 2 * num_kv_heads * head_dim * 4
    for rows in length_buckets(lengths, block_size, BUCKET_MAX_BYTES // token_bytes):
        attend_bucket(query, key_cache, value_cache, block_tables, lengths, rows, scale, out)
    for row, length in enumerate(lengths):
        if length == 0:   # a padding row: defined to give zeros
            out[row] = 0
    return out


def length_buckets(lengths: list[int], block_size: int, max_tokens: int = 1 << 16
                   ) -> list[list[int]]:
    """The rows with a context, longest first, cut where adding the next row would pad the
    bucket past BUCKET_SLACK or past `max_tokens` padded tokens. Each bucket's first row is its
    widest."""
    order = sorted((row for row, length in enumerate(lengths) if length > 0),
                   key=lambda row: -lengths[row])
    buckets: list[list[int]] = []
    width = real_blocks = 0
    for row in order:
        blocks = -(-lengths[row] // block_size)
        if buckets and width * (len(buckets[-1]) + 1) <= BUCKET_SLACK * (real_blocks + blocks) \
                and width * block_size * (len(buckets[-1]) + 1) <= max_tokens:
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
    span = width * block_size
    device = query.device
    index = torch.tensor(rows, device=device)
    blocks = block_tables.index_select(0, index)[:, :width].reshape(-1).long().clamp_(min=0)
    keys, values = gathered_context(key_cache, value_cache, blocks, count, span)
    grouped = query.index_select(0, index).float().view(count, num_kv_heads, group, head_dim)
    lens = torch.tensor([lengths[row] for row in rows], device=device)
    past_end = torch.arange(span, device=device)[None, :] >= lens[:, None]     # [count, span]
    # Padding slots hold whatever the cache held (never-written memory can be NaN), and a zero
    # probability times NaN is still NaN: the gathered copy's padding is zeroed, only its rows
    # (a broadcast masked_fill_ over the whole copy cost a quarter of the kernel).
    values.view(count * span, -1).index_fill_(0, past_end.view(-1).nonzero().squeeze(1), 0)
    scores = torch.empty(num_kv_heads, count, group, span, device=device)
    for head in range(num_kv_heads):
        # keys[:, :, head] is [count, span, head_dim] with a row stride of kv_heads * head_dim.
        torch.bmm(grouped[:, head], keys[:, :, head].transpose(1, 2), out=scores[head])
    scores.mul_(scale).masked_fill_(past_end[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    result = torch.empty(num_kv_heads, count, group, head_dim, device=device)
    for head in range(num_kv_heads):
        torch.bmm(probs[head], values[:, :, head], out=result[head])
    out.index_copy_(0, index, result.permute(1, 0, 2, 3).reshape(count, -1, head_dim)
                    .to(out.dtype))


class _Workspace(threading.local):
    """Per thread, the two fp32 buffers the last buckets were gathered into, kept so the next
    ones reuse their pages instead of faulting in fresh ones."""

    def __init__(self) -> None:
        self.buffers: dict[torch.device, torch.Tensor] = {}

    def take(self, device: torch.device, elements: int) -> torch.Tensor:
        buffer = self.buffers.get(device)
        if buffer is None or buffer.numel() < elements:
            # A normal tensor even when first asked for under inference_mode (as the engine
            # does): an inference tensor could not be written outside it afterwards.
            with torch.inference_mode(False):
                buffer = torch.empty(elements, dtype=torch.float32, device=device)
            self.buffers[device] = buffer
        return buffer[:elements]


_workspace = _Workspace()


def gathered_context(key_cache: torch.Tensor, value_cache: torch.Tensor, blocks: torch.Tensor,
                     count: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks' K and V, fp32, each [count, span, kv_heads, head_dim], in the workspace."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    shape = (blocks.shape[0], block_size, num_kv_heads, head_dim)
    size = blocks.shape[0] * block_size * num_kv_heads * head_dim
    buffer = _workspace.take(key_cache.device, 2 * size)
    keys, values = buffer[:size].view(shape), buffer[size:].view(shape)
    for cache, target in ((key_cache, keys), (value_cache, values)):
        if cache.dtype == torch.float32:
            torch.index_select(cache, 0, blocks, out=target)
        else:
            target.copy_(cache.index_select(0, blocks))
    return (keys.view(count, span, num_kv_heads, head_dim),
            values.view(count, span, num_kv_heads, head_dim))
