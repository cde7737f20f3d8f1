"""CUDA graphs of the decode pass (executor_service/engine/cuda_graphs.py): the batch sizes
captured (the padding a replay needs is in test_step_inputs.py), and on a GPU that replaying
gives the tokens the eager pass gives, for every architecture and batch sizes between buckets.

Only what the lent GPU machines have is imported at module level (scripts/device_check.sh runs
the gpu tests here)."""
from __future__ import annotations

import pytest
import torch

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.cuda_graphs import DecodeGraphs, bucket_for, decode_buckets
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import (ARCHITECTURES, random_prompts, transformers_greedy,
                                             write_checkpoint)

MAX_NEW = 10
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_buckets_step_by_eight_after_the_small_sizes_and_end_at_max_num_seqs():
    assert decode_buckets(256) == [1, 2, 4] + list(range(8, 257, 8))
    assert decode_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert decode_buckets(6) == [1, 2, 4, 6]
    assert decode_buckets(1) == [1]
    buckets = decode_buckets(20)
    assert [bucket_for(buckets, n) for n in (1, 3, 5, 9, 17, 20, 21)] == \
        [1, 4, 8, 16, 20, 20, None]


def test_graphs_need_a_cache_on_cuda(tmp_path):
    engine = build_engine(write_checkpoint("llama", tmp_path), EngineOptions(num_blocks=16),
                          LocalBlockAllocator())
    assert engine.runner.graphs is None  # the CPU serves eagerly
    with pytest.raises(ValueError, match="CUDA graphs need the KV cache on a CUDA device"):
        DecodeGraphs(engine.runner.model, engine.runner.kv_cache, engine.runner.inputs, 4)


def cuda_engine(directory, **options):
    return build_engine(directory, EngineOptions(device="cuda", dtype="float32", num_blocks=128,
                                                 max_num_seqs=12, **options),
                        LocalBlockAllocator())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_replayed_graphs_give_the_eager_tokens(architecture, tmp_path):
    """Greedy decodes of 1 to 11 sequences at once (every bucket up to 12, most of them padded):
    the graphs' tokens are the eager pass's and transformers'."""
    directory = write_checkpoint(architecture, tmp_path)
    graphs = cuda_engine(directory)
    eager = cuda_engine(directory, enforce_eager=True)
    assert graphs.runner.graphs is not None and eager.runner.graphs is None
    assert graphs.runner.graphs.buckets == [1, 2, 4, 8, 12]
    greedy = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    for count in (1, 3, 5, 11):
        prompts = random_prompts([3 + 7 * i for i in range(count)], seed=count)
        replays_before = graphs.runner.graph_replays
        replayed = [c.choices[0] for c in generate(graphs, prompts, greedy)]
        assert graphs.runner.graph_replays > replays_before, "no decode replayed a graph"
        assert replayed == [c.choices[0] for c in generate(eager, prompts, greedy)]
        if count <= 3:
            assert replayed == transformers_greedy(directory, prompts, MAX_NEW)
    assert eager.runner.graph_replays == 0


@pytest.mark.gpu
@needs_cuda
def test_prefill_and_mixed_iterations_run_eagerly_and_sampling_matches(tmp_path):
    """A long prompt in 16-token chunks next to decoding sequences: only the iterations with no
    prefill replay; seeded sampling gives the same tokens as eager."""
    directory = write_checkpoint("qwen2", tmp_path)
    options = dict(max_num_batched_tokens=16)
    graphs, eager = cuda_engine(directory, **options), \
        cuda_engine(directory, enforce_eager=True, **options)
    prompts = random_prompts([5, 9, 90], seed=2)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=MAX_NEW,
                             ignore_eos=True)
    replayed = generate(graphs, prompts, sampled)
    assert [c.choices for c in replayed] == [c.choices for c in generate(eager, prompts, sampled)]
    # 90 prompt tokens in 16-token chunks: at least 6 iterations carried a prefill.
    assert 0 < graphs.runner.graph_replays <= graphs.num_iterations - 6


def test_enforce_eager_comes_from_the_flag_or_the_variable(monkeypatch):
    # Imported here: the service's configuration brings grpc_health, which the GPU machines
    # these tests also run on lack.
    from executor_service.config import parse_config

    monkeypatch.delenv("PAGEDSERVE_EXECUTOR_ENFORCE_EAGER", raising=False)
    assert parse_config([]).engine.enforce_eager is False
    assert parse_config(["--enforce-eager"]).engine.enforce_eager is True
    monkeypatch.setenv("PAGEDSERVE_EXECUTOR_ENFORCE_EAGER", "true")
    assert parse_config([]).engine.enforce_eager is True
