"""The inner step both attention kernels share: read one tile of a sequence's context from the
paged cache and fold it into a running (online) softmax.

    running_max  per row, in log2 units (scores are pre-scaled by scale * log2 e: exp2 is the
                 native instruction)
    running_sum  per row, sum of exp2(score - running_max) over the tiles so far
    acc          per row, the same weights times V, unnormalised

Rescaling the old sum and accumulator by exp2(old_max - new_max) keeps them relative to the
current max, so the result is acc / running_sum after the last tile, in a single pass.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_kv_offsets(
    table_row,        # pointer to this sequence's row of the block table
    pos,              # [TILE] context positions
    pos_mask,         # [TILE] which positions exist
    kv_head, channel,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """Element offsets `[TILE, HEAD_DIM_PAD]` of the positions' K (or V) for one kv head: position
    p sits in slot p % BLOCK_SIZE of block table_row[p // BLOCK_SIZE]. int64, since a large
    block id times the elements per block passes 2**31."""
    block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
    row = (block * BLOCK_SIZE + pos % BLOCK_SIZE) * NUM_KV_HEADS + kv_head
    return row[:, None] * HEAD_DIM + channel[None, :]


@triton.jit
def attend_tile(
    query,            # [ROWS, HEAD_DIM_PAD] in the cache dtype (fp32 when UPCAST_DOT)
    key_cache_ptr, value_cache_ptr,
    kv_offset,        # [TILE, HEAD_DIM_PAD] from paged_kv_offsets
    kv_mask,          # [TILE, HEAD_DIM_PAD] positions that exist x real channels
    visible,          # [ROWS or 1, TILE] which positions each row may attend to
    running_max, running_sum, acc, scale_log2,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Folds one tile into (running_max, running_sum, acc) and returns them. The caller makes
    sure every row sees some position in its first tile, so running_max is finite from then on
    and a row that sees nothing of a later tile gets weight 0 there, never NaN."""
    key = tl.load(key_cache_ptr + kv_offset, mask=kv_mask, other=0.0)
    if UPCAST_DOT:
        key = key.to(tl.float32)
    scores = tl.dot(query, tl.trans(key), input_precision=DOT_PRECISION) * scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    probs = tl.exp2(scores - new_max[:, None])
    rescale = tl.exp2(running_max - new_max)
    running_sum = running_sum * rescale + tl.sum(probs, axis=1)
    value = tl.load(value_cache_ptr + kv_offset, mask=kv_mask, other=0.0)
    if UPCAST_DOT:
        value = value.to(tl.float32)
    acc = acc * rescale[:, None] + tl.dot(probs.to(value.dtype), value,
                                          input_precision=DOT_PRECISION)
    return new_max, running_sum, acc
