"""The three contenders of the throughput benchmark, each run once over a whole workload: greedy,
the same prompts, the same output lengths, end-of-sequence never stopping a request.

    ours        build_engine + offline.generate, every request submitted at once
    static      transformers `generate` on left-padded batches of `hf_batch` requests
    continuous  transformers' continuous batching, the manager `generate_batch` runs on

Each returns a Round: its wall time and the tokens it generated, per request in prompt order.
Set-up (loading, cache allocation, the continuous manager's warm-up) is not timed.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.throughput.workload import Settings, Workload
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.engine import Engine
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams

# Left padding of static batches; masked out, so any id does.
PAD_TOKEN_ID = 0
OURS, STATIC, CONTINUOUS = "ours", "static", "continuous"


@dataclass(slots=True)
class Round:
    wall_s: float
    # Generated token ids of each request, in prompt order.
    tokens: list[list[int]]
    # Ours only: engine iterations that sent a Step, decodes that waited for the allocator
    # (scheduler.num_stalls), decodes in all, preemptions, and each iteration's forward pass as
    # (decoding sequences, prompt tokens, seconds the iteration took).
    steps: int = 0
    stalls: int = 0
    decodes: int = 0
    preemptions: int = 0
    batches: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(tokens) for tokens in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- ours ---------------------------------------------------------------------------------------

def build_ours(settings: Settings, model_dir) -> Engine:
    return build_engine(model_dir, EngineOptions(
        device=settings.device, dtype=settings.dtype, kv_cache_memory=settings.kv_cache_bytes,
        max_num_batched_tokens=settings.max_batched_tokens), LocalBlockAllocator())


def cache_tokens(engine: Engine) -> int:
    """Tokens our KV cache holds: [layers, 2, num_blocks, block_size, kv_heads, head_dim]."""
    shape = engine.runner.kv_cache.shape
    return shape[2] * shape[3]


@contextmanager
def probed(engine: Engine, progress: tqdm | None, batches: list[tuple[int, int, float]]
           ) -> Iterator[None]:
    """generate() offers no hooks, so for one run the engine's own step and its runner's
    execute are wrapped: finished requests move the progress bar, and each iteration that
    computed something records its batch and its time (sampling reads the tokens back, so on
    a GPU too the step has finished when it returns)."""
    step, execute = engine.step, engine.runner.execute
    computed: list[tuple[int, int]] = []

    def counted_step():
        computed.clear()
        start = time.perf_counter()
        outputs = step()
        if computed:
            batches.append((*computed[0], time.perf_counter() - start))
        if progress is not None:
            progress.update(sum(output.finished for output in outputs))
        return outputs

    def recorded_execute(work, copies):
        if work:   # an iteration that only frees finished sequences computes nothing
            decoding = sum(seq.is_decoding for seq, _ in work)
            computed.append((decoding, sum(chunk for seq, chunk in work
                                           if not seq.is_decoding)))
        return execute(work, copies)

    engine.step, engine.runner.execute = counted_step, recorded_execute
    try:
        yield
    finally:
        del engine.step, engine.runner.execute   # the methods of the classes again


def run_ours(engine: Engine, workload: Workload, device: str, cache_salt: str,
             progress: tqdm | None = None) -> Round:
    """`cache_salt` differs per run: a later round must not find the prompts in the prefix
    cache an earlier one left behind."""
    params = [SamplingParams(temperature=0, max_tokens=length, ignore_eos=True)
              for length in workload.output_lens]
    scheduler = engine.scheduler
    before = (engine.num_steps, scheduler.num_stalls, scheduler.num_preemptions)
    batches: list[tuple[int, int, float]] = []
    with probed(engine, progress, batches):
        synchronize(device)
        start = time.perf_counter()
        completions = generate(engine, workload.prompts, params, cache_salt=cache_salt)
        synchronize(device)
        wall_s = time.perf_counter() - start
    failed = [c for c in completions if c.error is not None]
    if failed:
        raise RuntimeError(f"our engine failed {len(failed)} requests: {failed[0].error}")
    return Round(wall_s, [c.choices[0] for c in completions],
                 steps=engine.num_steps - before[0], stalls=scheduler.num_stalls - before[1],
                 decodes=sum(decoding for decoding, _, _ in batches),
                 preemptions=scheduler.num_preemptions - before[2], batches=batches)


# -- transformers -------------------------------------------------------------------------------

def load_transformers(model_dir, settings: Settings):
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, settings.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return model.to(settings.device).eval()


@torch.no_grad()
def run_static(model, workload: Workload, batch_size: int, device: str,
               progress: tqdm | None = None) -> Round:
    """Batches in arrival order. A batch generates up to its longest output; each request keeps
    the tokens it asked for. eos_token_id=None: end-of-sequence never stops a row (unlike
    min_new_tokens, which would forbid the token and change greedy picks)."""
    tokens: list[list[int]] = []
    synchronize(device)
    start = time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[first:first + batch_size]
        lengths = workload.output_lens[first:first + batch_size]
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), PAD_TOKEN_ID, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):] = 1
        output = model.generate(input_ids.to(device), attention_mask=attention_mask.to(device),
                                max_new_tokens=max(lengths), do_sample=False,
                                eos_token_id=None, pad_token_id=PAD_TOKEN_ID)
        generated = output[:, width:].tolist()
        tokens += [row[:length] for row, length in zip(generated, lengths)]
        if progress is not None:
            progress.update(len(prompts))
    synchronize(device)
    return Round(time.perf_counter() - start, tokens)


def continuous_config(settings: Settings, engine_cache_tokens: int):
    """The same budget as ours: as many cached tokens (pages of 256 tokens) and as many tokens
    per forward pass; everything else is transformers' default."""
    from transformers import ContinuousBatchingConfig

    defaults = ContinuousBatchingConfig()
    # transformers 5.24 calls the unit a page; 5.17 (the lent GPU machine's) a block.
    page_size = getattr(defaults, "page_size", None) or defaults.block_size
    return ContinuousBatchingConfig(num_blocks=math.ceil(engine_cache_tokens / page_size),
                                    max_batch_tokens=settings.max_batched_tokens)


@torch.no_grad()
def run_continuous(model, workload: Workload, warmup: Workload, cb_config, device: str,
                   progress: tqdm | None = None) -> Round:
    """`generate_batch` opens this same context manager with these workload hints, but takes
    one max_new_tokens for all requests and times its own set-up; here each request gets its
    own length and only serving is timed, after the warm-up requests."""
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    # eos_token_id -1: the manager's "no end-of-sequence".
    generation = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=PAD_TOKEN_ID,
                                  max_new_tokens=max(workload.output_lens))
    hints = WorkloadHints(max_prompt_length=max(len(p) for p in workload.prompts),
                          max_generated_length=max(workload.output_lens),
                          num_requests=len(workload.prompts))
    with model.continuous_batching_context_manager(
            generation_config=generation, continuous_batching_config=cb_config,
            workload_hints=hints, block=True, timeout=5) as manager:
        serve(manager, warmup, None)
        synchronize(device)
        start = time.perf_counter()
        tokens = serve(manager, workload, progress)
        synchronize(device)
        wall_s = time.perf_counter() - start
    return Round(wall_s, tokens)


def serve(manager, workload: Workload, progress: tqdm | None) -> list[list[int]]:
    request_ids = [manager.add_request(prompt, max_new_tokens=length)
                   for prompt, length in zip(workload.prompts, workload.output_lens)]
    finished = {}
    while len(finished) < len(request_ids):
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped")
            continue
        if not result.is_finished():
            continue
        if result.error is not None:
            raise RuntimeError(f"generate_batch failed {result.request_id}: {result.error}")
        finished[result.request_id] = list(result.generated_tokens)
        if progress is not None:
            progress.update(1)
    return [finished[request_id] for request_id in request_ids]
