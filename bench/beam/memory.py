"""KV blocks a beam search holds, with copy-on-write sharing and as the same beams would hold
them unshared.

One request at a time runs in an in-process engine (the allocator core in-process, a cache
large enough that nothing is preempted). After every iteration the allocator's table of each of
the request's sequences (its beams) is read:

- shared: the distinct physical blocks in those tables, which is what the pool holds for the
  request (full blocks of a common history appear once, with a reference per beam);
- unshared: the sum of the tables' lengths, which is what the same beams would hold if every
  beam owned a copy of its history (the PagedAttention paper's baseline).

Both counts come from the same iterations of the same search, so the beams' choices, their
lookahead reserves and their lengths are identical; only the sharing differs. Reported: the mean
over the request's iterations (each iteration alike) and the peak, and the saving
1 - shared / unshared.
"""
from __future__ import annotations

from dataclasses import dataclass

from executor_service.engine.engine import Engine
from pagedserve.protocol.sampling_params import SamplingParams


@dataclass(slots=True)
class BlockCounts:
    width: int
    # Per iteration of the request: (shared, unshared) blocks.
    samples: list[tuple[int, int]]

    @property
    def mean_shared(self) -> float:
        return sum(shared for shared, _ in self.samples) / len(self.samples)

    @property
    def mean_unshared(self) -> float:
        return sum(unshared for _, unshared in self.samples) / len(self.samples)

    @property
    def peak_shared(self) -> int:
        return max(shared for shared, _ in self.samples)

    @property
    def peak_unshared(self) -> int:
        return max(unshared for _, unshared in self.samples)

    @property
    def saved(self) -> float:
        """The share of the unshared blocks that sharing saves, over the whole request."""
        return 1.0 - self.mean_shared / self.mean_unshared


def beam_params(width: int, max_tokens: int) -> SamplingParams:
    """All `width` hypotheses returned, no stop token: every contender generates the same count."""
    return SamplingParams(n=width, beam_width=width, max_tokens=max_tokens, temperature=0,
                          ignore_eos=True)


def count_blocks(engine: Engine, request_id: str, prompt: list[int], width: int,
                 max_tokens: int) -> BlockCounts:
    pool = engine.allocator.pool
    engine.add_request(request_id, prompt, beam_params(width, max_tokens))
    samples: list[tuple[int, int]] = []
    prefix = f"{request_id}#"
    while engine.has_work():
        for output in engine.step():
            if output.error is not None:
                raise RuntimeError(f"{request_id} failed: {output.error}")
        tables = [seq.block_table for seq_id, seq in pool.sequences.items()
                  if seq_id.startswith(prefix)]
        if tables:
            samples.append((len({block.block_id for table in tables for block in table}),
                            sum(len(table) for table in tables)))
    if engine.scheduler.num_preemptions:
        raise RuntimeError("a beam request was preempted: the cache is too small to measure")
    return BlockCounts(width, samples)
