"""Loading a local Hugging Face checkpoint directory into CausalLM.

Weights come from `model.safetensors`, or from the shards a `model.safetensors.index.json`
names. The model is built on the meta device (no time spent initialising weights that are
overwritten anyway), given its serving dtype while still there, materialised on the target
device with its projections already fused, and every parameter is filled from the checkpoint
by name, one tensor at a time (safetensors_stream.py). So a load never holds more than the
model in its serving dtype plus the largest single tensor: a bf16 model of a float32
checkpoint does not pass through float32, and no shard is mapped whole.

A missing or unexpected tensor, or one of the wrong shape, refuses the checkpoint: it would
mean the config and the weights disagree, and serving it would be wrong.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from executor_service.model.causal_lm import CausalLM
from executor_service.model.model_config import ModelConfig, UnsupportedModel
from executor_service.model.safetensors_stream import SafetensorsReader

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Tensors some checkpoints carry that the math does not use (recomputed from the config).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def resolve_dtype(requested: str, config: ModelConfig, device: torch.device) -> torch.dtype:
    """`auto`: the checkpoint's own dtype on a GPU; float32 on the CPU, where half-precision
    matmuls are slow or missing."""
    if requested != "auto":
        if requested not in DTYPES:
            raise ValueError(f"--dtype must be auto or one of {', '.join(DTYPES)}, "
                             f"got {requested!r}")
        return DTYPES[requested]
    if device.type == "cpu":
        return torch.float32
    return DTYPES.get(config.checkpoint_dtype.removeprefix("torch."), torch.bfloat16)


def weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / shard for shard in shards]
    single = directory / "model.safetensors"
    if single.exists():
        return [single]
    raise UnsupportedModel(f"{directory} holds no model.safetensors (nor a sharded index); "
                           "only safetensors checkpoints are served")


def load_model(directory: Path, config: ModelConfig, dtype: torch.dtype,
               device: torch.device, max_positions: int, *,
               pack_weights: bool = True) -> CausalLM:
    """The checkpoint's model, projections fused; `pack_weights`: linear layers through
    oneDNN-packed weights where that applies (packed_linear.py; not for a compiled model)."""
    directory = Path(directory)
    with torch.device("meta"):
        model = CausalLM(config)
    # The dtype first, on meta (free); then real memory, once, in the serving dtype. What
    # `to_empty` does, with torch.empty: its empty_like of a meta tensor runs torch's Python
    # reference, which imports sympy (half a second and 50 MB of an executor's start).
    model = model.to(dtype=dtype)._apply(
        lambda meta: torch.empty(meta.shape, dtype=meta.dtype, device=device))
    # Fused before loading: each q/k/v and gate/up parameter becomes a view into its fused
    # weight, so the checkpoint's tensors land in place and no fused copy is made afterwards.
    model.fuse_projections()
    parameters = dict(model.named_parameters())
    loaded: set[str] = set()
    for path in weight_files(directory):
        with SafetensorsReader(path) as shard:
            for entry in shard.entries():
                name = entry.name
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    continue  # some tied checkpoints store the shared matrix twice
                if name not in parameters:
                    raise UnsupportedModel(f"{path.name} holds {name}, which a "
                                           f"{config.architecture} with this config does not "
                                           "have")
                target = parameters[name]
                if entry.shape != tuple(target.shape):
                    raise UnsupportedModel(f"{name} is {entry.shape} in {path.name}, "
                                           f"the config implies {tuple(target.shape)}")
                shard.read_into(entry, target)
                loaded.add(name)
    missing = sorted(set(parameters) - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise UnsupportedModel(f"the checkpoint in {directory} lacks {shown}")
    if pack_weights:
        model.pack_weights()
    model.build_rotary(max_positions, device)
    return model.eval()
