"""pagedserve's side of the memory benchmark: the real engine (scheduler, preemption, sampler,
outputs) and the real allocator core in-process, stepped to the end, its pool sampled after
every iteration.

The one thing not real is the forward pass. Where the memory goes does not depend on the
tokens a model computes (outputs have fixed lengths, end-of-sequence is ignored, and the
prompts share no prefix), but a CPU forward pass over a 65,536-token cache costs 0.1 s or more an
iteration, minutes per block size; and the kernels serve block sizes 16 to 256 only, while the
allocator also takes 8. So `StandInRunner` does what the model runner does to the sequences
(advances their computed mark, hands back a logits row for each that needs a token) without
computing anything. tests/bench/test_bench_memory.py replays the --quick workload through an engine
built by `build_engine` on a small random Llama checkpoint and pins that every sample is the same.

Sampled from the allocator core's pool, the accounting the admin API's `pool_stats` reports
(`pagedctl stats`): slots = blocks referenced by a sequence × block size (blocks on the free
list, prefix-cached or not, are not counted); tokens = per sequence, the tokens the allocator
recorded for it, at most its table's capacity; sequences = the sequences the pool holds. After
an iteration the allocator has recorded exactly the tokens samples.py counts: a whole
prompt from its Allocate on, then the token each Append reported, which that iteration's forward
pass wrote. Every `CHECK_EVERY`-th sample is checked against `pool_stats` itself.
"""
from __future__ import annotations

import time

import torch

from allocator_service.core.executor_pool import ExecutorPool
from allocator_service.core.inspection import pool_stats
from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.memory.samples import Sample, SchemeRun, paged_name
from bench.memory.workload import Settings, Workload
from executor_service.engine.engine import Engine
from executor_service.engine.request import Sequence
from executor_service.engine.sampler import Sampler
from executor_service.engine.scheduler import SchedulerConfig
from pagedserve.protocol.sampling_params import SamplingParams

# The engine should never refuse a request for the number of sequences: only memory limits.
MAX_NUM_SEQS = 1 << 16
CHECK_EVERY = 64


class StandInRunner:
    """The model runner's bookkeeping without its arithmetic: every sequence in the iteration's
    work computes its chunk, and each that reached its last token gets a logits row of zeros
    (greedy then picks token 0)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device("cpu")

    def execute(self, work: list[tuple[Sequence, int]], copies: list[tuple[int, int]]
                ) -> tuple[torch.Tensor | None, list[Sequence]]:
        sampled = []
        for seq, chunk in work:
            seq.num_computed += chunk
            if seq.num_computed == len(seq.token_ids):
                sampled.append(seq)
        if not sampled:
            return None, []
        return torch.zeros(len(sampled), self.vocab_size), sampled


def stand_in_engine(settings: Settings, block_size: int) -> Engine:
    """An engine of `settings`' sizes whose forward pass is `StandInRunner`."""
    scheduler = SchedulerConfig(block_size, MAX_NUM_SEQS, settings.max_batched_tokens,
                                settings.lookahead_slots)
    engine = Engine(StandInRunner(settings.vocab_size), Sampler(), LocalBlockAllocator(),
                    scheduler, vocab_size=settings.vocab_size,
                    max_model_len=settings.max_model_len, eos_token_ids=())
    engine.register_pool(settings.budget_slots // block_size, f"memory-bench:bs{block_size}")
    return engine


def replay_paged(engine: Engine, workload: Workload, label: str = "", progress=None
                 ) -> SchemeRun:
    """Submits every request at once and steps the engine until all are done."""
    allocator = engine.allocator
    assert isinstance(allocator, LocalBlockAllocator), "the pool is read in-process"
    pool = allocator.pool
    block_size = pool.block_size
    run = SchemeRun(paged_name(block_size), label or f"pagedserve, block {block_size}",
                    pool.num_blocks * block_size)
    started = time.perf_counter()
    wanted: dict[str, int] = {}   # request id -> output tokens it asked for
    received: dict[str, int] = {}
    for index, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens)):
        request_id = f"r{index}"
        engine.add_request(request_id, prompt, SamplingParams(
            temperature=0, max_tokens=output_len, ignore_eos=True))
        wanted[request_id], received[request_id] = output_len, 0
    while engine.has_work():
        for output in engine.step():
            received[output.request_id] += sum(len(delta.token_ids) for delta in output.deltas)
            if output.finished:
                request_id = output.request_id
                whole = output.error is None and received[request_id] == wanted[request_id]
                run.completed += whole and output.deltas[-1].finish_reason == "length"
                if progress is not None:
                    progress.update(1)
        if pool.sequences:  # the last Step only frees
            run.samples.append(sample(pool, saturated=bool(engine.scheduler.waiting)))
            if len(run.samples) % CHECK_EVERY == 1:
                run.checked += 1
                run.agreed += agrees_with_pool_stats(pool, run.samples[-1])
    run.preemptions = engine.scheduler.num_preemptions
    run.wall_s = time.perf_counter() - started
    return run


def sample(pool: ExecutorPool, saturated: bool) -> Sample:
    size = pool.block_size
    tokens = sum(min(seq.num_tokens, len(seq.block_table) * size)
                 for seq in pool.sequences.values())
    slots = (pool.num_blocks - pool.num_free_blocks) * size
    return Sample(saturated, len(pool.sequences), tokens, slots)


def agrees_with_pool_stats(pool: ExecutorPool, counted: Sample) -> bool:
    """Whether the admin API's statistics (which walk every block) say the same."""
    stats = pool_stats("memory-bench", pool)
    return (stats.tokens_stored, stats.slots_allocated, stats.num_sequences) == \
        (counted.tokens, counted.slots, counted.sequences)
