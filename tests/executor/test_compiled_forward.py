"""The forward pass through torch.compile (executor_service/model/compiled_forward.py): greedy
tokens still transformers' for every architecture, every graph compiled at start-up and none
while serving, and the choice of when to compile."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.model.compiled_forward import WARM_UP_TOKENS, compile_wanted
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import (ARCHITECTURES, random_prompts, transformers_greedy,
                                             write_checkpoint)

MAX_NEW = 12
# One model per serving process: each test starts from dynamo's empty caches, as a fresh
# executor would.
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_compiled_greedy_tokens_are_transformers_and_nothing_compiles_while_serving(
        architecture, tmp_path):
    directory = write_checkpoint(architecture, tmp_path)
    prompts = random_prompts([1, 6, 23, 70], seed=5)
    expected = transformers_greedy(directory, prompts, MAX_NEW)
    # A 16-token budget: prefill chunks next to decodes, batches of many sizes.
    engine = build_engine(directory, EngineOptions(num_blocks=64, max_num_batched_tokens=16,
                                                   compile="on"), LocalBlockAllocator())
    assert engine.runner.model.segments.compiled
    assert engine.runner.model.packed_logits is None  # oneDNN-packed linears are opaque to inductor
    # Three parts (before and after attention, the final norm), each at the warm-up shapes.
    graphs_at_start = counters["stats"]["unique_graphs"]
    assert graphs_at_start == 3 * len(WARM_UP_TOKENS)

    completions = generate(engine, prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW,
                                                           ignore_eos=True))
    assert [c.choices[0] for c in completions] == expected
    assert counters["stats"]["unique_graphs"] == graphs_at_start


def test_eager_is_the_fallback_and_auto_compiles_on_cuda_only(tmp_path):
    assert compile_wanted("auto", torch.device("cuda")) is True
    assert compile_wanted("auto", torch.device("cpu")) is False
    assert compile_wanted("on", torch.device("cpu")) is True
    assert compile_wanted("off", torch.device("cuda")) is False
    with pytest.raises(ValueError, match="--compile must be one of auto, on, off, got 'yes'"):
        compile_wanted("yes", torch.device("cpu"))
    engine = build_engine(write_checkpoint("llama", tmp_path),
                          EngineOptions(num_blocks=16, compile="off"), LocalBlockAllocator())
    assert not engine.runner.model.segments.compiled
    assert counters["stats"]["unique_graphs"] == 0
