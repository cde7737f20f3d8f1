"""Bounds on what one request may ask of the allocator; anything past them is refused."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Limits:
    # 2**24 blocks of 16 slots is 268M token slots: past any GPU's KV memory today.
    max_num_blocks: int = 1 << 24
    max_block_size: int = 4096
    max_ops_per_step: int = 65536
    max_id_length: int = 256
    # Reserving ahead is for a few decode steps, not for claiming a pool.
    max_lookahead_slots: int = 1 << 16
