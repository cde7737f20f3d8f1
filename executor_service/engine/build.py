"""Building an Engine from a checkpoint directory: config, weights, KV cache, allocator pool."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from executor_service.engine.block_allocator import BlockAllocator, LocalBlockAllocator
from executor_service.engine.engine import Engine
from executor_service.engine.scheduler import SchedulerConfig
from executor_service.model.loader import load_model, resolve_dtype
from executor_service.model.model_config import ModelConfig
from kernels import KvCacheSpec, allocate_kv_cache


@dataclass(frozen=True, slots=True)
class EngineOptions:
    device: str = "cpu"
    dtype: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory: int = 256 * 1024 ** 2     # bytes, when num_blocks is not given
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    lookahead_slots: int = 4
    sampler_seed: int | None = None


def model_fingerprint(directory: Path, dtype: torch.dtype, block_size: int) -> str:
    """Same fingerprint = same KV for the same tokens: the model's config and weights' names,
    the dtype and the block size. Prefix-cache hashes are rooted in it."""
    config = (directory / "config.json").read_bytes()
    digest = hashlib.blake2b(config, digest_size=8).hexdigest()
    return f"{directory.name}:{digest}:{str(dtype).removeprefix('torch.')}:bs{block_size}"


def build_engine(directory: Path, options: EngineOptions = EngineOptions(),
                 allocator: BlockAllocator | None = None) -> Engine:
    directory = Path(directory)
    device = torch.device(options.device)
    config = ModelConfig.from_dir(directory, max_model_len=options.max_model_len)
    max_model_len = options.max_model_len or config.max_position_embeddings
    dtype = resolve_dtype(options.dtype, config, device)
    model = load_model(directory, config, dtype, device, max_model_len)
    spec = KvCacheSpec(config.num_layers, options.num_blocks or 0, options.block_size,
                       config.num_kv_heads, config.head_dim, dtype)
    if not spec.num_blocks:
        spec = replace(spec, num_blocks=max(1, options.kv_cache_memory // spec.bytes_per_block))
    num_blocks = spec.num_blocks
    kv_cache = allocate_kv_cache(spec, device)
    scheduler = SchedulerConfig(options.block_size, options.max_num_seqs,
                                options.max_num_batched_tokens, options.lookahead_slots)
    engine = Engine(model, kv_cache, allocator or LocalBlockAllocator(), scheduler,
                    max_model_len=max_model_len, eos_token_ids=config.eos_token_ids,
                    sampler_seed=options.sampler_seed)
    engine.register_pool(num_blocks, model_fingerprint(directory, dtype, options.block_size))
    return engine
