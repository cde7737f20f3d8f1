"""Bounds on what one request may ask of the allocator; anything past them is refused."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Limits:
    # 2**20 blocks of 16 slots is 16.7M token slots, past a 141 GB GPU's KV cache for any
    # model of 1B parameters or more; such a pool builds in about a second and 260 MB.
    max_num_blocks: int = 1 << 20
    max_block_size: int = 4096
    max_ops_per_step: int = 65536
    max_id_length: int = 256
    # Reserving ahead is for a few decode steps, not for claiming a pool.
    max_lookahead_slots: int = 1 << 16
