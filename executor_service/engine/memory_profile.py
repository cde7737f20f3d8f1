"""Sizing the KV cache on a GPU from --gpu-memory-utilization.

The cache gets what is left of `utilization x total` once everything else is counted: what the
device already holds after the weights are loaded (the weights, the CUDA context, other
processes), and the activations of the largest forward pass the scheduler can ask for. That
pass is run once here, before the cache exists: a prefill of --max-num-batched-tokens tokens and
the sampler's work on --max-num-seqs rows with every option that costs memory switched on, so
the measured peak is the real one rather than an estimate from shapes.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from executor_service.engine.sampler import Sampler, SamplingRow
from executor_service.model.attention_batch import AttentionBatch
from executor_service.model.causal_lm import CausalLM
from kernels import KvCacheSpec, allocate_kv_cache
from pagedserve.protocol.sampling_params import MAX_LOGPROBS, SamplingParams

log = logging.getLogger(__name__)


class NotEnoughGpuMemory(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class GpuMemory:
    total: int
    # Held on the device by everything but our activations: weights, CUDA context, others.
    in_use: int
    # The most the profiling pass allocated on top of what was allocated before it.
    activation_peak: int


def kv_cache_budget(memory: GpuMemory, utilization: float) -> int:
    """Bytes the KV cache may take; refuses when nothing is left."""
    budget = int(utilization * memory.total) - memory.in_use - memory.activation_peak
    if budget <= 0:
        gib = 1024 ** 3
        raise NotEnoughGpuMemory(
            f"--gpu-memory-utilization {utilization:g} allows {utilization * memory.total / gib:.2f}"
            f" GiB of the GPU's {memory.total / gib:.2f} GiB, but {memory.in_use / gib:.2f} GiB "
            f"are already in use (weights, CUDA context, other processes) and the largest "
            f"forward pass needs {memory.activation_peak / gib:.2f} GiB more: raise "
            "--gpu-memory-utilization, lower --max-num-batched-tokens / --max-num-seqs, or give "
            "--num-blocks")
    return budget


def largest_forward(model: CausalLM, spec: KvCacheSpec, num_tokens: int, num_rows: int,
                    max_model_len: int, device: torch.device) -> None:
    """The biggest iteration the scheduler can build: `num_tokens` prompt tokens (in sequences
    of at most max_model_len) over a scratch cache of just the blocks they need, then the
    sampler on `num_rows` rows with penalties, top-k/top-p and logprobs."""
    lengths = [min(max_model_len, num_tokens - start)
               for start in range(0, num_tokens, max_model_len)]
    block_counts = [math.ceil(length / spec.block_size) for length in lengths]
    scratch_spec = KvCacheSpec(spec.num_layers, sum(block_counts), spec.block_size,
                               spec.num_kv_heads, spec.head_dim, spec.dtype)
    kv_cache = allocate_kv_cache(scratch_spec, device)
    tables, slots, positions, first_block = [], [], [], 0
    for length, count in zip(lengths, block_counts):
        tables.append(list(range(first_block, first_block + count)))
        slots += range(first_block * spec.block_size, first_block * spec.block_size + length)
        positions += range(length)
        first_block += count
    width = max(block_counts)
    table_rows = [row + [-1] * (width - len(row)) for row in tables]
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    as_tensor = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)  # noqa
    batch = AttentionBatch(
        slot_mapping=as_tensor(slots, torch.int64), num_decode_tokens=0,
        decode_block_tables=torch.empty((0, 0), dtype=torch.int32, device=device),
        decode_context_lens=torch.empty(0, dtype=torch.int32, device=device),
        max_decode_context=0,
        prefill_block_tables=as_tensor(table_rows, torch.int32),
        prefill_query_start=as_tensor(starts, torch.int32),
        prefill_seq_lens=as_tensor(lengths, torch.int32),
        max_prefill_query=max(lengths), max_prefill_seq=max(lengths))
    hidden = model(torch.zeros(num_tokens, dtype=torch.int64, device=device),
                   as_tensor(positions, torch.int64), kv_cache, batch)
    rows = min(num_rows, num_tokens)
    logits = model.logits(hidden[-rows:]).float()
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1,
                            presence_penalty=0.5, frequency_penalty=0.5,
                            logprobs=MAX_LOGPROBS)
    Sampler(seed=0).sample(logits, [SamplingRow(params, [0, 1], [2]) for _ in range(rows)])


def measure_gpu_memory(model: CausalLM, spec: KvCacheSpec, num_tokens: int, num_rows: int,
                       max_model_len: int, device: torch.device) -> GpuMemory:
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    allocated_before = torch.cuda.memory_allocated(device)
    largest_forward(model, spec, num_tokens, num_rows, max_model_len, device)
    torch.cuda.synchronize(device)
    activation_peak = torch.cuda.max_memory_allocated(device) - allocated_before
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    memory = GpuMemory(total=total, in_use=total - free, activation_peak=activation_peak)
    log.info("GPU memory: %.2f GiB total, %.2f GiB in use after loading, %.2f GiB for the "
             "largest forward pass", total / 1024 ** 3, memory.in_use / 1024 ** 3,
             activation_peak / 1024 ** 3)
    return memory
