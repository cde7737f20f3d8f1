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
lookahead reserves and their lengths are identical; only the sharing differs. report.Blocks
sums them up: the mean over the iterations (each alike) and the peak, and the saving
1 - shared / unshared.
"""
from __future__ import annotations

from executor_service.engine.engine import Engine
from pagedserve.protocol.sampling_params import SamplingParams


def beam_params(width: int, max_tokens: int) -> SamplingParams:
    """All `width` hypotheses returned, no stop token: every contender generates the same count."""
    return SamplingParams(n=width, beam_width=width, max_tokens=max_tokens, temperature=0,
                          ignore_eos=True)


def count_blocks(engine: Engine, request_id: str, prompt: list[int], width: int,
                 max_tokens: int) -> list[tuple[int, int]]:
    """(shared, unshared) blocks after each iteration of one beam-search request."""
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
            samples.append((len({block for table in tables for block in table}),
                            sum(len(table) for table in tables)))
    if engine.scheduler.num_preemptions:
        raise RuntimeError("a beam request was preempted: the cache is too small to measure")
    return samples
