"""One decoder-only model for every supported architecture (Llama, Mistral, Qwen2, Qwen3),
written for flattened variable-length batches over the paged KV cache.

The architectures differ only in switches ModelConfig already resolved (biases, Qwen3's q/k
norm, tied embeddings, head_dim, RoPE scaling). Module names follow Hugging Face's, so
`model.layers.3.self_attn.q_proj.weight` in a checkpoint is that parameter here.
"""
from __future__ import annotations

import torch
from torch import nn

from executor_service.model.attention import Attention
from executor_service.model.attention_batch import AttentionBatch
from executor_service.model.layers import RMSNorm, SwiGLU
from executor_service.model.model_config import ModelConfig
from executor_service.model.packed_linear import PackedLinear, linear, pack_if_supported
from executor_service.model.rope import RotaryEmbedding
from kernels import layer_caches


class DecoderLayer(nn.Module):
    """A layer runs in three parts: `before_attention` and `after_attention` are tensor math
    only (what torch.compile compiles: compiled_forward.py), and the attention over the paged
    cache between them runs eagerly."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def before_attention(self, hidden: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.self_attn.project(self.input_layernorm(hidden), rotation)

    def after_attention(self, attended: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's output from the attention's `[tokens, heads * head_dim]` and the
        layer's input `hidden` (the residual)."""
        hidden = hidden + self.self_attn.o_proj(attended)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Segments:
    """The functions the forward pass calls for its tensor math, each taking the module it
    runs as its first argument; compiled_forward.py swaps in compiled ones. One function for
    every layer (not a bound method per layer), so torch.compile makes one graph for all."""

    def __init__(self, before_attention=DecoderLayer.before_attention,
                 after_attention=DecoderLayer.after_attention, final_norm=RMSNorm.forward,
                 compiled: bool = False) -> None:
        self.before_attention, self.after_attention = before_attention, after_attention
        self.final_norm, self.compiled = final_norm, compiled


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # The model is built on meta and filled from the checkpoint (loader.py), so its random
        # init is waste; an explicit weight skips it, and with it the first call of an init
        # function on meta, which imports torch._dynamo (over a second of an executor's start).
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary: RotaryEmbedding | None = None
        self.packed_logits: PackedLinear | None = None
        # The forward pass's tensor-math parts: eager, or compiled (compiled_forward.py).
        self.segments = Segments()

    def build_rotary(self, max_positions: int, device: torch.device) -> None:
        """Built apart from the weights: the weights are created on the meta device and loaded,
        the cos/sin table is computed."""
        with torch.device(device):
            self.rotary = RotaryEmbedding(self.config.rope, self.config.head_dim, max_positions)

    def fuse_projections(self) -> None:
        """After the weights are loaded: q/k/v and gate/up each become one matmul."""
        for layer in self.model.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def pack_weights(self) -> None:
        """Last step of loading, after the dtype and device are final: the linear layers the
        forward pass calls get a oneDNN-packed copy of their weights (on the CPU only)."""
        for layer in self.model.layers:
            layer.self_attn.pack_weights()
            layer.mlp.pack_weights()
        self.packed_logits = pack_if_supported(self.output_embedding(), None)

    def output_embedding(self) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                batch: AttentionBatch) -> torch.Tensor:
        """Hidden states `[tokens, hidden]` after the final norm, for `input_ids [tokens]` at
        `positions [tokens]`; each token's K/V is stored into its slot of `kv_cache`."""
        hidden = self.model.embed_tokens(input_ids)
        rotation = self.rotary.rotation(positions, hidden.dtype)
        segments = self.segments
        for index, layer in enumerate(self.model.layers):
            key_cache, value_cache = layer_caches(kv_cache, index)
            query, key, value = segments.before_attention(layer, hidden, rotation)
            attended = layer.self_attn.attend(query, key, value, key_cache, value_cache, batch)
            hidden = segments.after_attention(layer, attended, hidden)
        return segments.final_norm(self.model.norm, hidden)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.output_embedding(), None, self.packed_logits)
