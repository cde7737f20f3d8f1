"""Every Triton kernel variant a serving run launches is compiled at start-up
(executor_service/model/kernel_warm_up.py), and there is one per kernel.

The engine runs here on the Triton kernels in Triton's interpreter (PAGEDSERVE_KERNELS=triton),
so the launches are the ones a GPU executor makes; each launch's variant is what Triton's own
binder computes from the arguments (tests/support/triton_variants.py). The run mixes what changes
from batch to batch: decode batches of several sizes, prefill chunks next to decodes, block
tables of growing width, a prefix-cache hit and parallel sampling (copy-on-write).
"""
from __future__ import annotations

import pytest
import torch

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.model.causal_lm import CausalLM
from executor_service.model.model_config import ModelConfig
from kernels import KvCacheSpec, allocate_kv_cache, layer_caches
from kernels.dispatch import KERNELS_VARIABLE
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.kernel_cases import require_triton
from tests.support.model_checkpoints import random_prompts, transformers_greedy, write_checkpoint
from tests.support.triton_variants import kernel_names, record_variants

KERNELS = {"_store_kv_kernel", "_decode_segment_kernel", "_decode_merge_kernel",
           "_prefill_kernel", "_copy_blocks_kernel"}
MAX_NEW = 6


@pytest.fixture
def triton_everywhere(monkeypatch):
    require_triton("cpu")
    monkeypatch.setenv(KERNELS_VARIABLE, "triton")


def test_a_serving_run_launches_only_variants_the_warm_up_compiled(triton_everywhere,
                                                                  monkeypatch, tmp_path):
    directory = write_checkpoint("qwen3", tmp_path)
    # Lengths across block boundaries (16) and a chunked prompt (a 16-token budget).
    prompts = random_prompts([3, 17, 40], seed=4)
    expected = transformers_greedy(directory, prompts, MAX_NEW)
    with record_variants(monkeypatch) as warm_up:
        engine = build_engine(directory, EngineOptions(num_blocks=48, max_num_batched_tokens=16),
                              LocalBlockAllocator())
    assert kernel_names(warm_up) == KERNELS
    assert len(warm_up) == len(KERNELS), "one variant per kernel"

    greedy = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    with record_variants(monkeypatch) as serving:
        completions = generate(engine, prompts, greedy)
        # The first prompt again (a prefix-cache hit), and two samples sharing its blocks until
        # they diverge (copy-on-write).
        forked = generate(engine, [prompts[1]], SamplingParams(
            n=2, temperature=1.0, seed=3, max_tokens=MAX_NEW, ignore_eos=True))
    # The Triton path gives transformers' tokens, so the launches recorded are real ones.
    assert [c.choices[0] for c in completions] == expected
    assert len(forked[0].choices) == 2
    assert kernel_names(serving) == KERNELS, "every kernel ran while serving"
    assert serving <= warm_up, f"compiled while serving: {sorted(serving - warm_up)}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_batch_shapes_never_make_a_new_variant(monkeypatch, dtype):
    """Launcher calls shaped as the model makes them (query, key and value as views of one
    fused projection), from 1 to 256 rows and block tables from 1 to 2048 blocks wide: only
    the model's shape and dtype reach the specialisation. The kernels are not run."""
    require_triton("cpu")
    from kernels.triton.copy_blocks import copy_blocks_triton
    from kernels.triton.decode_attention import paged_decode_attention_triton
    from kernels.triton.prefill_attention import paged_prefill_attention_triton
    from kernels.triton.store_kv import store_kv_triton

    heads, kv_heads, head_dim, block_size = 8, 2, 64, 16
    kv_cache = allocate_kv_cache(KvCacheSpec(1, 64, block_size, kv_heads, head_dim, dtype), "cpu")
    key_cache, value_cache = layer_caches(kv_cache, 0)
    with record_variants(monkeypatch, launch=False) as variants:
        for rows in (1, 3, 8, 17, 64, 256):
            for width in (1, 7, 16, 33, 2048):
                fused = torch.zeros(rows, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
                query, key, value = fused.split(
                    [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
                query = query.view(rows, heads, head_dim)
                key = key.view(rows, kv_heads, head_dim)
                value = value.view(rows, kv_heads, head_dim)
                tables = torch.zeros(rows, width, dtype=torch.int32)
                lengths = torch.ones(rows, dtype=torch.int32)
                out = torch.empty_like(query)
                store_kv_triton(key, value, key_cache, value_cache,
                                torch.full((rows,), -1, dtype=torch.int64))
                paged_decode_attention_triton(query, key_cache, value_cache, tables, lengths,
                                              0.125, max_context_len=1, out=out)
                starts = torch.arange(rows + 1, dtype=torch.int32)
                paged_prefill_attention_triton(query, key_cache, value_cache, tables, starts,
                                               lengths, 0.125, max_query_len=1, max_seq_len=1,
                                               out=out)
                copy_blocks_triton(kv_cache, [(i, 32 + i) for i in range(min(rows, 32))])
    assert kernel_names(variants) == KERNELS
    assert len(variants) == len(KERNELS), sorted(variants)


def test_the_warm_up_pass_leaves_the_fresh_cache_empty(triton_everywhere, tmp_path):
    from executor_service.model.kernel_warm_up import warm_up_kernels
    from executor_service.model.loader import load_model

    directory = write_checkpoint("llama", tmp_path)
    config = ModelConfig.from_dir(directory)
    model: CausalLM = load_model(directory, config, torch.float32, torch.device("cpu"), 64)
    kv_cache = allocate_kv_cache(KvCacheSpec(config.num_layers, 4, 16, config.num_kv_heads,
                                             config.head_dim, torch.float32), "cpu")
    warm_up_kernels(model, kv_cache)
    assert not kv_cache.any(), "the warm-up stored K/V into the cache"
