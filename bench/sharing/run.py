"""One run of the sharing benchmark: submit a case's requests at once, step the engine until
every one is done, and after each iteration count the KV blocks in use.

A block is in use while some sequence's table holds it (ref_count > 0): that is the allocator's
"used" in GetStats. Blocks on the free list that still hold prefix-cache entries are not in
use; they are the cache, not the load, and any allocation may evict them. The count is read
after each `step()` (its Step has applied: this iteration's allocations, forks, copies and
frees), and it holds while that iteration computes, so the mean weights each sample by the
iteration's duration: block-seconds over seconds, the memory the run kept busy on average.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm import tqdm

from bench.sharing.workload import Submission
from executor_service.engine.engine import Engine


@dataclass(slots=True)
class Run:
    # From the first request in to the last token out.
    wall_s: float
    # Per submission, the tokens of each of its choices.
    tokens: list[list[list[int]]]
    # Per iteration: blocks in use after its Step, and the seconds the iteration took.
    blocks: list[tuple[int, float]] = field(default_factory=list)
    # Prompt tokens the engine computed (the rest came from the prefix cache).
    prompt_tokens_computed: int = 0
    cached_tokens: int = 0
    preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(choice) for choices in self.tokens for choice in choices)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s

    @property
    def peak_blocks(self) -> int:
        return max(used for used, _ in self.blocks)

    @property
    def mean_blocks(self) -> float:
        """Time-weighted: block-seconds over the seconds the iterations took."""
        return sum(used * step_s for used, step_s in self.blocks) / \
            sum(step_s for _, step_s in self.blocks)

    @property
    def iteration_mean_blocks(self) -> float:
        """Every iteration alike: the same for every run of the same schedule (no timing)."""
        return sum(used for used, _ in self.blocks) / len(self.blocks)


def run_case(engine: Engine, submissions: list[Submission], tag: str,
             progress: tqdm | None = None) -> Run:
    """`tag` names the run's requests. The prefix cache is emptied first, so the run starts
    alike whatever ran before (the salts differ per run as well)."""
    pool = engine.allocator.pool
    engine.allocator.core.reset_prefix_cache(engine.allocator.executor_id)
    preemptions = engine.scheduler.num_preemptions
    request_ids = [f"{tag}-{i}" for i in range(len(submissions))]
    tokens = [[[] for _ in range(s.params.n)] for s in submissions]
    index = {request_id: i for i, request_id in enumerate(request_ids)}
    run = Run(0.0, tokens)
    start = time.perf_counter()
    for request_id, submission in zip(request_ids, submissions):
        engine.add_request(request_id, submission.prompt, submission.params,
                           submission.cache_salt)
    while engine.has_work():
        step_start = time.perf_counter()
        outputs = engine.step()
        run.blocks.append((pool.num_blocks - pool.num_free_blocks,
                           time.perf_counter() - step_start))
        for output in outputs:
            if output.error is not None:
                raise RuntimeError(f"request {output.request_id} failed: {output.error}")
            choices = tokens[index[output.request_id]]
            for delta in output.deltas:
                choices[delta.index] += delta.token_ids
            if output.finished:
                usage = output.usage
                run.prompt_tokens_computed += usage.prompt_tokens - usage.cached_tokens
                run.cached_tokens += usage.cached_tokens
                if progress is not None:
                    progress.update(1)
    run.wall_s = time.perf_counter() - start
    run.preemptions = engine.scheduler.num_preemptions - preemptions
    return run
