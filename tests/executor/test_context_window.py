"""The context window an engine serves is what its KV cache can hold for one sequence: lowered
from the model's when the cache is smaller, refused at start-up when asked for explicitly."""
from __future__ import annotations

import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.context_window import WindowOverCache, served_window
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint

# 4 blocks of 16 slots, 4 of them reserved ahead of a sequence: one sequence holds 60 tokens.
NUM_BLOCKS, FITS = 4, 4 * 16 - 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


def test_a_cache_smaller_than_the_window_lowers_it(checkpoint):
    engine = build_engine(checkpoint, EngineOptions(num_blocks=NUM_BLOCKS), LocalBlockAllocator())
    assert engine.max_model_len == FITS


def test_a_sequence_that_fills_the_cache_ends_with_length_not_an_error(checkpoint):
    # Before the window was lowered, this sequence asked for a fifth block the pool does not
    # have and could only fail.
    engine = build_engine(checkpoint, EngineOptions(num_blocks=NUM_BLOCKS), LocalBlockAllocator())
    prompt = random_prompts([10], seed=7)[0]
    [completion] = generate(engine, [prompt], SamplingParams(
        temperature=0, max_tokens=1000, ignore_eos=True), max_steps=200)
    assert completion.error is None
    assert completion.finish_reasons == ["length"]
    assert len(prompt) + len(completion.choices[0]) == FITS


def test_a_window_that_fits_is_served_as_it_is(checkpoint):
    engine = build_engine(checkpoint, EngineOptions(num_blocks=NUM_BLOCKS, max_model_len=32),
                          LocalBlockAllocator())
    assert engine.max_model_len == 32


def test_an_explicit_window_over_the_cache_is_refused_with_the_figures(checkpoint):
    with pytest.raises(WindowOverCache, match=r"--max-model-len 61 does not fit: the KV cache "
                       r"holds 64 token slots \(4 blocks of 16\).*at most 60"):
        build_engine(checkpoint, EngineOptions(num_blocks=NUM_BLOCKS, max_model_len=61),
                     LocalBlockAllocator())


def test_a_cache_too_small_for_any_sequence_is_refused():
    with pytest.raises(WindowOverCache, match="too small to serve any sequence"):
        served_window(4096, explicit=False, num_blocks=1, block_size=4, lookahead_slots=4)
