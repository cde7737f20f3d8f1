"""--max-num-seqs bounds the sequences an engine runs at once, also when many requests arrive
in the same iteration (each admitted request's sequences count from the iteration that admits
it, before the allocator has answered its Allocate)."""
from __future__ import annotations

import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("n", [1, 2])
def test_requests_arriving_together_are_admitted_up_to_max_num_seqs(checkpoint, n):
    engine = build_engine(checkpoint, EngineOptions(num_blocks=64, max_num_seqs=4),
                          LocalBlockAllocator())
    params = SamplingParams(n=n, max_tokens=6, ignore_eos=True)
    for index, prompt in enumerate(random_prompts([5, 6, 7, 8, 9], seed=3)):
        engine.add_request(f"r{index}", prompt, params)
    most = 0
    while engine.has_work():
        engine.step()
        most = max(most, len(engine.allocator.pool.sequences))
    assert most == 4


def test_more_choices_than_max_num_seqs_are_refused_up_front(checkpoint):
    engine = build_engine(checkpoint, EngineOptions(num_blocks=64, max_num_seqs=4),
                          LocalBlockAllocator())
    with pytest.raises(InvalidArgument, match=r"n = 5 choices .* \(max_num_seqs 4\)"):
        engine.add_request("wide", [1, 2, 3], SamplingParams(n=5, max_tokens=2))
    assert not engine.has_work()
