"""How big the executor's KV cache gets: --num-blocks, --kv-cache-memory, and on CUDA
--gpu-memory-utilization after profiling the largest forward pass; and the flags' refusals."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import (DEFAULT_CPU_KV_CACHE_MEMORY, EngineOptions,
                                           blocks_for_budget, build_engine)
from executor_service.engine.memory_profile import (GpuMemory, NotEnoughGpuMemory, kv_cache_budget,
                                                    largest_forward, measure_gpu_memory)
from executor_service.model.causal_lm import CausalLM
from executor_service.model.embedded import write_embedded_checkpoint
from executor_service.model.loader import load_model
from executor_service.model.model_config import ModelConfig
from kernels import KvCacheSpec, allocate_kv_cache
from pagedserve.protocol.limits import Limits

GiB = 1024 ** 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedded_checkpoint(tmp_path_factory.mktemp("embedded"))


def loaded(checkpoint: Path, device: str) -> tuple[CausalLM, KvCacheSpec]:
    config = ModelConfig.from_dir(checkpoint)
    model = load_model(checkpoint, config, torch.float32, torch.device(device), 512)
    spec = KvCacheSpec(config.num_layers, 0, 16, config.num_kv_heads, config.head_dim,
                       torch.float32)
    return model, spec


def test_budget_is_what_utilization_leaves_after_weights_and_activations():
    memory = GpuMemory(total=80 * GiB, in_use=10 * GiB, activation_peak=2 * GiB)
    assert kv_cache_budget(memory, 0.9) == int(0.9 * 80 * GiB) - 12 * GiB


def test_a_budget_with_nothing_left_is_refused_with_the_figures():
    memory = GpuMemory(total=16 * GiB, in_use=14 * GiB, activation_peak=1 * GiB)
    with pytest.raises(NotEnoughGpuMemory, match=r"allows 14.40 GiB.*14.00 GiB are already in "
                                                 r"use.*needs 1.00 GiB more"):
        kv_cache_budget(memory, 0.9)


@pytest.mark.parametrize("num_tokens, max_model_len", [(300, 512), (1000, 256)])
def test_the_profiling_pass_runs_the_largest_batch(checkpoint, num_tokens, max_model_len):
    """On the CPU only that it runs: a prefill split into sequences of at most max_model_len
    tokens, and the sampler with every memory-costing option, on as many rows as asked."""
    model, spec = loaded(checkpoint, "cpu")
    largest_forward(model, spec, num_tokens=num_tokens, num_rows=64,
                    max_model_len=max_model_len, device=torch.device("cpu"))


def test_block_count_comes_from_the_first_size_given(checkpoint):
    engine = build_engine(checkpoint, EngineOptions(num_blocks=7, kv_cache_memory=GiB),
                          LocalBlockAllocator())
    assert engine.runner.kv_cache.shape[2] == 7
    _, spec = loaded(checkpoint, "cpu")
    engine = build_engine(checkpoint, EngineOptions(kv_cache_memory=100 * spec.bytes_per_block),
                          LocalBlockAllocator())
    assert engine.runner.kv_cache.shape[2] == 100
    engine = build_engine(checkpoint, EngineOptions(), LocalBlockAllocator())
    assert engine.runner.kv_cache.shape[2] == DEFAULT_CPU_KV_CACHE_MEMORY // spec.bytes_per_block


# executor_service.config is imported by the two flag tests alone: it brings the gRPC server
# plumbing (grpc_health), which the lent GPU machines lack, and this file's gpu test runs there
# (scripts/device_check.sh).
@pytest.mark.parametrize("flags, message", [
    (["--gpu-memory-utilization", "0.9"], "on --device cpu give --kv-cache-memory"),
    (["--device", "cuda", "--gpu-memory-utilization", "0"], "must be in \\(0, 1\\]"),
    (["--device", "cuda", "--gpu-memory-utilization", "1.5"], "must be in \\(0, 1\\]"),
])
def test_bad_utilization_flags_are_refused(flags, message):
    from executor_service.config import parse_config

    with pytest.raises(SystemExit, match=message):
        parse_config(flags)


def test_flags_and_environment_reach_the_engine_options(monkeypatch):
    from executor_service.config import parse_config

    config = parse_config(["--device", "cuda", "--gpu-memory-utilization", "0.5"])
    assert config.engine.gpu_memory_utilization == 0.5 and config.engine.kv_cache_memory is None
    monkeypatch.setenv("PAGEDSERVE_EXECUTOR_KV_CACHE_MEMORY", "64M")
    assert parse_config([]).engine.kv_cache_memory == 64 * 1024 ** 2


@pytest.mark.gpu
def test_utilization_sizes_the_cache_from_measured_gpu_memory(checkpoint):
    model, spec = loaded(checkpoint, "cuda")
    memory = measure_gpu_memory(model, spec, 2048, 256, 512, torch.device("cuda"))
    assert 0 < memory.activation_peak < memory.total and 0 < memory.in_use < memory.total
    del model
    torch.cuda.empty_cache()
    engine = build_engine(checkpoint, EngineOptions(device="cuda", dtype="float32",
                                                    max_model_len=512,
                                                    gpu_memory_utilization=0.5), LocalBlockAllocator())
    cache = engine.runner.kv_cache
    expected = kv_cache_budget(memory, 0.5) // spec.bytes_per_block
    if expected > Limits().max_num_blocks:
        # The test model is tiny: half an H200 holds more blocks than one pool may have.
        assert cache.shape[2] == Limits().max_num_blocks
    else:
        # Both measurements see the same device, give or take what other processes did
        # meanwhile.
        assert abs(cache.shape[2] - expected) <= 0.05 * expected


def test_a_budget_past_the_largest_pool_is_capped_at_it():
    assert blocks_for_budget(10 * 4096, 4096, limit=16) == 10
    assert blocks_for_budget(100 * 4096, 4096, limit=16) == 16
    assert blocks_for_budget(100, 4096, limit=16) == 1
    # The default cap is the allocator's own limit, so the pool it builds registers.
    assert blocks_for_budget(1 << 50, 1) == Limits().max_num_blocks


def resident_bytes_of_mapping(address: int) -> int | None:
    """Rss of the /proc/self/smaps mapping that holds `address` (None: not found)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                start, end = (int(part, 16) for part in first.split("-"))
                inside = start <= address < end
            elif inside and first == "Rss:":
                return int(line.split()[1]) * 1024
    return None


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_the_cpu_kv_cache_is_resident_from_the_start():
    # An untouched CPU tensor gets pages on first write, so the executor would grow while
    # traffic reached blocks never used before; the cache is committed when allocated.
    spec = KvCacheSpec(2, 512, 16, 2, 32, torch.float32)   # 16 MiB: its own mmap
    kv_cache = allocate_kv_cache(spec, "cpu")
    size = kv_cache.numel() * kv_cache.element_size()
    resident = resident_bytes_of_mapping(kv_cache.data_ptr())
    assert resident is not None and resident >= size, (resident, size)
