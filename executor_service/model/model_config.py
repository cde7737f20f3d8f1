"""What our model code needs to know about a checkpoint, read from its config.json, and the
refusal of every config it cannot serve faithfully.

Hugging Face configs come in two dialects: transformers 4 writes `rope_theta` and
`rope_scaling`, transformers 5 folds both into `rope_parameters`. Both are read. Anything that
would change the math and that this code does not implement (another RoPE type, a sliding
window shorter than the context we serve, an activation other than SiLU, quantized weights) is
refused at start with `UnsupportedModel`, never approximated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModel(ValueError):
    """The checkpoint needs something this model code does not implement."""


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only: the band between these wavelengths is interpolated smoothly.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool          # Qwen2 always; Llama / Qwen3 with attention_bias
    o_bias: bool            # Llama / Qwen3 with attention_bias
    mlp_bias: bool          # Llama with mlp_bias
    qk_norm: bool           # Qwen3: RMSNorm over each head's q and k before RoPE
    checkpoint_dtype: str   # as the checkpoint states it, e.g. "bfloat16"
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_dir(cls, directory: Path, max_model_len: int | None = None) -> ModelConfig:
        path = Path(directory) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise UnsupportedModel(f"{directory} has no config.json: not a Hugging Face "
                                   "checkpoint directory") from None
        generation = Path(directory) / "generation_config.json"
        extra_eos = json.loads(generation.read_text()).get("eos_token_id") \
            if generation.exists() else None
        return cls.from_hf(raw, max_model_len=max_model_len, extra_eos=extra_eos)

    @classmethod
    def from_hf(cls, raw: dict, *, max_model_len: int | None = None,
                extra_eos: int | list[int] | None = None) -> ModelConfig:
        architectures = raw.get("architectures") or []
        architecture = architectures[0] if architectures else None
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModel(f"architecture {architecture!r} is not served; supported: "
                                   f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        if raw.get("quantization_config"):
            raise UnsupportedModel("quantized checkpoints are not served "
                                   f"({raw['quantization_config'].get('quant_method', '?')})")
        activation = raw.get("hidden_act", "silu")
        if activation != "silu":
            raise UnsupportedModel(f"hidden_act {activation!r} is not served (only silu)")
        hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise UnsupportedModel(f"{heads} attention heads are not a multiple of {kv_heads} "
                                   "key/value heads")
        max_positions = raw.get("max_position_embeddings", 2048)
        served_len = max_model_len or max_positions
        check_attention_window(raw, architecture, served_len)
        bias = bool(raw.get("attention_bias", False))
        return cls(
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=read_rope(raw, max_positions),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=architecture == "Qwen2ForCausalLM" or (
                bias and architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM")),
            o_bias=bias and architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM"),
            mlp_bias=architecture == "LlamaForCausalLM" and bool(raw.get("mlp_bias", False)),
            qk_norm=architecture == "Qwen3ForCausalLM",
            checkpoint_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
            eos_token_ids=eos_ids(raw.get("eos_token_id"), extra_eos),
            bos_token_id=raw.get("bos_token_id"),
        )


def read_rope(raw: dict, max_positions: int) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModel(f"RoPE type {rope_type!r} is not served; supported: "
                               f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModel(f"partial rotary embeddings ({partial}) are not served")
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    factor = float(params.get("factor", 1.0))
    if rope_type == "linear":
        return RopeConfig(theta=float(theta), rope_type="linear", factor=factor)
    return RopeConfig(
        theta=float(theta), rope_type="llama3", factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings",
                                                        max_positions)))


def check_attention_window(raw: dict, architecture: str, served_len: int) -> None:
    """Refuses a sliding window that would cut attention short of the context we serve: our
    kernels attend over the whole context, which would be wrong past the window."""
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types") or []
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if not raw.get("use_sliding_window", False) and \
                all(kind == "full_attention" for kind in layer_types):
            return
    elif layer_types and all(kind == "full_attention" for kind in layer_types):
        return
    if window is None or window >= served_len:
        return
    raise UnsupportedModel(
        f"the model attends within a sliding window of {window} tokens, and this executor "
        f"would serve contexts of up to {served_len} with full attention; serve it with "
        f"--max-model-len {window} or less")


def eos_ids(*sources: int | list[int] | None) -> tuple[int, ...]:
    ids: list[int] = []
    for source in sources:
        if source is None:
            continue
        for token in source if isinstance(source, list) else [source]:
            if token not in ids:
                ids.append(int(token))
    return tuple(ids)

