"""Watches an engine's forward passes for writes into shared blocks: a sequence must never
write a slot of a block another sequence holds too (copy-on-write first)."""
from __future__ import annotations


def shared_writes(engine) -> list[tuple[str, int]]:
    """Wraps the engine's forward pass: the (sequence, block) of every slot written into a
    block whose reference count, as the allocator's own pool says (an in-process allocator),
    is not 1. The list fills as the engine runs."""
    pool = engine.allocator.pool
    block_size = engine.scheduler.config.block_size
    written_shared: list[tuple[str, int]] = []
    execute = engine.runner.execute

    def checked(work, copies):
        for seq, chunk in work:
            for position in range(seq.num_computed, seq.num_computed + chunk):
                block = seq.block_table[position // block_size]
                if pool.blocks.blocks[block].ref_count != 1:
                    written_shared.append((seq.seq_id, block))
        return execute(work, copies)

    engine.runner.execute = checked
    return written_shared
