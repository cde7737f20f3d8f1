"""Bounds on what one request may ask of the allocator; anything past them is refused."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Limits:
    # 2**20 blocks of 16 slots is 16.7M token slots, past a 141 GB GPU's KV cache for any
    # model of 1B parameters or more; such a pool builds in 0.2 s and 200 MB (compiled).
    max_num_blocks: int = 1 << 20
    max_block_size: int = 4096
    # Token slots of one pool (num_blocks × block_size). The allocator keeps a pool's tokens in
    # one array of 4 bytes a slot (core/block.py), made when the pool is registered: 2**27
    # slots is 512 MB, where the two limits above alone would allow 16 GB. At 2 KB of K/V a
    # token, 2**27 tokens is 256 GB of KV cache, more than any one GPU holds.
    max_pool_slots: int = 1 << 27
    max_ops_per_step: int = 65536
    max_id_length: int = 256
    # Reserving ahead is for a few decode steps, not for claiming a pool.
    max_lookahead_slots: int = 1 << 16

    def max_blocks_of(self, block_size: int) -> int:
        """The most blocks of this size one pool may have."""
        return min(self.max_num_blocks, self.max_pool_slots // max(1, block_size))
