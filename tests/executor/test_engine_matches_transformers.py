"""The engine's greedy tokens are transformers' greedy tokens, for every supported architecture,
however the engine gets there: a batch of prompts of different lengths served together,
prompts cut into chunks, a prompt whose prefix comes from the prefix cache, and a pool so small
that requests are preempted and recomputed."""
from __future__ import annotations

from pathlib import Path

import pytest

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import (ARCHITECTURES, random_prompts, transformers_greedy,
                                             write_checkpoint)

MAX_NEW = 20


def assert_pool_clean(engine) -> None:
    """Every sequence freed, every invariant of the pool holds."""
    pool = engine.allocator.pool
    assert audit_pool("engine", pool) == []
    assert pool.sequences == {}

GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
LENGTHS = [1, 5, 17, 40, 63, 90]


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def checkpoint(request, tmp_path_factory) -> tuple[Path, list[list[int]], list[list[int]]]:
    directory = write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    prompts = random_prompts(LENGTHS, seed=len(request.param))
    return directory, prompts, transformers_greedy(directory, prompts, MAX_NEW)


def test_concurrent_batch_of_different_lengths(checkpoint):
    directory, prompts, expected = checkpoint
    engine = build_engine(directory, EngineOptions(num_blocks=128), LocalBlockAllocator())
    completions = generate(engine, prompts, GREEDY)
    assert [c.choices[0] for c in completions] == expected
    assert all(c.finish_reasons == ["length"] for c in completions)
    assert_pool_clean(engine)


def test_chunked_prefill(checkpoint):
    """A budget of 16 tokens per iteration: the longer prompts take several iterations, next
    to other sequences' decodes."""
    directory, prompts, expected = checkpoint
    engine = build_engine(directory, EngineOptions(num_blocks=128, max_num_batched_tokens=16),
                          LocalBlockAllocator())
    completions = generate(engine, prompts, GREEDY)
    assert [c.choices[0] for c in completions] == expected
    assert_pool_clean(engine)


def test_prefix_cache_hit_gives_the_same_tokens_and_reports_cached_tokens(checkpoint):
    directory, prompts, _ = checkpoint
    shared = prompts[-1][:64]
    first, second = shared + [7, 8, 9], shared + [11, 12]
    expected = transformers_greedy(directory, [first, second], MAX_NEW)
    engine = build_engine(directory, EngineOptions(num_blocks=128), LocalBlockAllocator())
    (one,) = generate(engine, [first], GREEDY)
    (two,) = generate(engine, [second], GREEDY)
    assert [one.choices[0], two.choices[0]] == expected
    assert one.usage.cached_tokens == 0
    # 64 shared tokens fill 4 blocks of 16, all computed by the first request.
    assert two.usage.cached_tokens == 64


def test_repetition_penalty_over_prompt_and_output_as_transformers_applies_it(checkpoint):
    """The engine keeps each sequence's token counts as tokens arrive (token_counts.py);
    transformers rescans prompt and output every step. Same tokens, batched or not."""
    directory, prompts, _ = checkpoint
    expected = transformers_greedy(directory, prompts, MAX_NEW, repetition_penalty=1.8)
    engine = build_engine(directory, EngineOptions(num_blocks=128, max_num_batched_tokens=32),
                          LocalBlockAllocator())
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True,
                            repetition_penalty=1.8)
    completions = generate(engine, prompts, params)
    assert [c.choices[0] for c in completions] == expected
    assert expected != checkpoint[2]  # the penalty changed what greedy picks
    assert_pool_clean(engine)


def test_preemption_when_the_pool_is_too_small(checkpoint):
    """14 blocks of 16 slots cannot hold six sequences growing to 110 tokens at once."""
    directory, prompts, expected = checkpoint
    engine = build_engine(directory, EngineOptions(num_blocks=14, max_num_batched_tokens=64),
                          LocalBlockAllocator())
    completions = generate(engine, prompts, GREEDY)
    assert engine.scheduler.num_preemptions > 0
    assert [c.choices[0] for c in completions] == expected
    assert_pool_clean(engine)
