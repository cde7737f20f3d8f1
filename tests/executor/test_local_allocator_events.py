"""An in-process engine (LocalBlockAllocator) keeps no KV events: the service's state store
publishes them, but in process nobody does, and kept they grew with every request."""
from __future__ import annotations

import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


def test_an_in_process_engine_keeps_no_kv_events(checkpoint):
    engine = build_engine(checkpoint, EngineOptions(num_blocks=64), LocalBlockAllocator())
    for index, prompt in enumerate(random_prompts([20, 24, 40], seed=4)):
        engine.add_request(f"e{index}", prompt, SamplingParams(max_tokens=3))
    while engine.has_work():
        engine.step()
    assert engine.allocator.core.events.num_pending == 0
