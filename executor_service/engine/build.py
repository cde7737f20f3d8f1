"""Building an Engine from a checkpoint directory: config, weights, KV cache, allocator pool."""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from executor_service.engine.block_allocator import BlockAllocator
from executor_service.engine.context_window import served_window
from executor_service.engine.engine import Engine
from executor_service.engine.memory_profile import kv_cache_budget, measure_gpu_memory
from executor_service.engine.scheduler import SchedulerConfig
from executor_service.model.causal_lm import CausalLM
from executor_service.model.compiled_forward import compile_segments, compile_wanted, warm_up
from executor_service.model.kernel_warm_up import warm_up_kernels
from executor_service.model.loader import load_model, resolve_dtype
from executor_service.model.model_config import ModelConfig
from executor_service.model.tokenizer_files import TOKENIZER_JSON
from kernels import KvCacheSpec, allocate_kv_cache
from kernels.dispatch import runs_triton
from pagedserve.protocol.limits import Limits

DEFAULT_CPU_KV_CACHE_MEMORY = 256 * 1024 ** 2
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    device: str = "cpu"
    dtype: str = "auto"
    block_size: int = 16
    # The cache's size, first given of: num_blocks; kv_cache_memory (bytes); on CUDA,
    # gpu_memory_utilization of the device (memory_profile.py); on the CPU,
    # DEFAULT_CPU_KV_CACHE_MEMORY.
    num_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    lookahead_slots: int = 4
    # Steps only when the allocator must act (scheduler.py); False: an Append per sequence
    # per iteration, the protocol before sparse Steps.
    sparse_steps: bool = True
    # Iterations a Step may be put off while nothing needs its answer (scheduler.py).
    step_interval: int = 1
    # The widest beam search a request may ask for.
    max_beam_width: int = 16
    # Whole blocks a decoding sequence's Append reserves ahead (scheduler.py).
    reserve_blocks: int = 1
    sampler_seed: int | None = None
    # torch.compile of the forward pass's tensor math: auto (on CUDA only), on, off (eager).
    compile: str = "auto"
    # No CUDA graphs of the decode pass (cuda_graphs.py): every iteration runs eagerly.
    enforce_eager: bool = False


def model_fingerprint(directory: Path, dtype: torch.dtype, block_size: int) -> str:
    """Same fingerprint = same KV for the same tokens: the model's config and weights' names,
    the dtype and the block size. Prefix-cache hashes are rooted in it."""
    config = (directory / "config.json").read_bytes()
    digest = hashlib.blake2b(config, digest_size=8).hexdigest()
    return f"{directory.name}:{digest}:{str(dtype).removeprefix('torch.')}:bs{block_size}"


def kv_cache_bytes(model: CausalLM, spec: KvCacheSpec, options: EngineOptions,
                   max_model_len: int, device: torch.device) -> int:
    if options.kv_cache_memory is not None:
        return options.kv_cache_memory
    if device.type != "cuda":
        return DEFAULT_CPU_KV_CACHE_MEMORY
    memory = measure_gpu_memory(model, spec, options.max_num_batched_tokens,
                                options.max_num_seqs, max_model_len, device)
    return kv_cache_budget(memory, options.gpu_memory_utilization)


def blocks_for_budget(budget: int, bytes_per_block: int,
                      limit: int = Limits().max_num_blocks) -> int:
    """How many blocks a measured memory budget buys, capped at the largest pool the allocator
    registers: a small model on a large GPU (a test model on an H200) would otherwise ask for
    millions of blocks and be refused. Memory past the cap stays free."""
    wanted = max(1, budget // bytes_per_block)
    if wanted > limit:
        log.warning("the KV cache budget of %d bytes holds %d blocks; capped at %d, the most "
                    "one pool may have", budget, wanted, limit)
    return min(wanted, limit)


def _tokenizer_json(directory: Path) -> str | None:
    """The text structured output compiles grammars against (executor_service/engine/
    grammar.py); a checkpoint without one serves free text only."""
    path = directory / TOKENIZER_JSON
    return path.read_text(encoding="utf-8") if path.is_file() else None


def build_engine(directory: Path, options: EngineOptions, allocator: BlockAllocator) -> Engine:
    """The engine for a checkpoint, its pool registered with `allocator`: the service's client
    (RemoteBlockAllocator) in an executor, an in-process LocalBlockAllocator elsewhere."""
    directory = Path(directory)
    device = torch.device(options.device)
    config = ModelConfig.from_dir(directory, max_model_len=options.max_model_len)
    max_model_len = options.max_model_len or config.max_position_embeddings
    dtype = resolve_dtype(options.dtype, config, device)
    compiled = compile_wanted(options.compile, device)
    model = load_model(directory, config, dtype, device, max_model_len,
                       pack_weights=not compiled)
    if compiled:
        compile_segments(model)
        warm_up(model)
    spec = KvCacheSpec(config.num_layers, options.num_blocks or 0, options.block_size,
                       config.num_kv_heads, config.head_dim, dtype)
    if not spec.num_blocks:
        budget = kv_cache_bytes(model, spec, options, max_model_len, device)
        spec = replace(spec, num_blocks=blocks_for_budget(
            budget, spec.bytes_per_block, Limits().max_blocks_of(spec.block_size)))
    num_blocks = spec.num_blocks
    max_model_len = served_window(max_model_len, explicit=options.max_model_len is not None,
                                  num_blocks=num_blocks, block_size=options.block_size,
                                  lookahead_slots=options.lookahead_slots)
    kv_cache = allocate_kv_cache(spec, device)
    scheduler = SchedulerConfig(options.block_size, options.max_num_seqs,
                                options.max_num_batched_tokens, options.lookahead_slots,
                                options.sparse_steps, options.step_interval,
                                options.max_beam_width, options.reserve_blocks)
    engine = Engine.for_model(model, kv_cache, allocator, scheduler,
                              max_model_len=max_model_len,
                              eos_token_ids=config.eos_token_ids,
                              sampler_seed=options.sampler_seed,
                              tokenizer_json=_tokenizer_json(directory))
    # Everything that compiles, before the first request: the Triton kernels (each variant a
    # serving run meets), then the decode graphs (which need every kernel compiled already).
    if runs_triton(kv_cache):
        warm_up_kernels(model, kv_cache)
    if device.type == "cuda" and not options.enforce_eager:
        engine.runner.capture_decode_graphs(options.max_num_seqs)
    engine.register_pool(num_blocks, model_fingerprint(directory, dtype, options.block_size))
    return engine
