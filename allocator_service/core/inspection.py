"""Read-only views of a pool for the admin API: block states, fill levels and statistics."""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass

from allocator_service.core.executor_pool import ExecutorPool


class BlockState(enum.IntEnum):
    """Values are those of the proto enum BlockState."""
    FREE = 1
    CACHED_FREE = 2
    USED = 3


@dataclass(slots=True, frozen=True)
class BlockView:
    block_id: int
    state: BlockState
    ref_count: int
    block_hash: bytes
    num_tokens: int
    parent_hash: bytes = b""


@dataclass(slots=True)
class PoolStats:
    executor_id: str
    block_size: int
    num_blocks: int = 0
    num_free_blocks: int = 0
    num_cached_free_blocks: int = 0
    num_used_blocks: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    tokens_stored: int = 0
    slots_allocated: int = 0
    num_sequences: int = 0
    refcount_histogram: Counter[int] | None = None

    @property
    def usage_percent(self) -> float:
        return 100.0 * self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return (self.prefix_hit_tokens / self.prefix_query_tokens
                if self.prefix_query_tokens else 0.0)

    def add(self, other: PoolStats) -> None:
        """Accumulates another pool into this total."""
        if self.block_size != other.block_size:
            self.block_size = 0  # pools differ: no single block size describes the total
        for name in ("num_blocks", "num_free_blocks", "num_cached_free_blocks",
                     "num_used_blocks", "prefix_query_tokens", "prefix_hit_tokens",
                     "tokens_stored", "slots_allocated", "num_sequences"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.refcount_histogram = (self.refcount_histogram or Counter()) + (
            other.refcount_histogram or Counter())


def block_fill(pool: ExecutorPool) -> dict[int, int]:
    """Tokens written in each used block; a shared block counts its fullest holder."""
    size = pool.block_size
    fill: dict[int, int] = {}
    for seq in pool.sequences.values():
        for index, block_id in enumerate(seq.block_ids()):
            tokens = min(size, max(0, seq.num_tokens - index * size))
            if tokens > fill.get(block_id, -1):
                fill[block_id] = tokens
    return fill


def block_views(pool: ExecutorPool) -> list[BlockView]:
    fill = block_fill(pool)
    views = []
    for block in pool.blocks.blocks:
        if block.ref_count > 0:
            state = BlockState.USED
        elif block.block_hash is not None:
            state = BlockState.CACHED_FREE
        else:
            state = BlockState.FREE
        views.append(BlockView(block.block_id, state, block.ref_count, block.block_hash or b"",
                               fill.get(block.block_id, 0), block.parent_hash or b""))
    return views


def pool_stats(executor_id: str, pool: ExecutorPool) -> PoolStats:
    stats = PoolStats(executor_id, pool.block_size, num_blocks=pool.num_blocks,
                      prefix_query_tokens=pool.prefix_query_tokens,
                      prefix_hit_tokens=pool.prefix_hit_tokens,
                      num_sequences=len(pool.sequences), refcount_histogram=Counter())
    # Counted over the pool's arrays in one compiled pass, not through a view per block.
    used, cached_free, histogram = pool.blocks.usage()
    stats.num_used_blocks, stats.num_cached_free_blocks = used, cached_free
    stats.num_free_blocks = pool.num_blocks - used - cached_free
    stats.refcount_histogram = Counter(histogram)
    stats.tokens_stored = sum(tokens for block_id, tokens in block_fill(pool).items()
                              if pool.blocks.ref_count(block_id) > 0)
    stats.slots_allocated = stats.num_used_blocks * pool.block_size
    return stats


def total_stats(pools: list[PoolStats]) -> PoolStats:
    """The sum over pools, named "total"; block_size 0 when the pools' sizes differ."""
    total = PoolStats("total", pools[0].block_size if pools else 0)
    for stats in pools:
        total.add(stats)
    return total
