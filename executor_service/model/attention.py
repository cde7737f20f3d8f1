"""Self-attention of one decoder layer over the paged KV cache.

Projections carry Hugging Face's parameter names (q_proj, k_proj, v_proj, o_proj, and Qwen3's
q_norm / k_norm), so a checkpoint's weights load by name; after loading, q, k and v run as one
matmul (layers.FusedLinear). `project` computes the rotated query, key and value; `attend`
stores the new K/V into their slots, then decode rows and prefill rows each go through their
kernel. The layer (causal_lm.py) runs o_proj on the result.
"""
from __future__ import annotations

import torch
from torch import nn

import kernels
from executor_service.model.attention_batch import AttentionBatch
from executor_service.model.layers import FusedLinear, Linear, RMSNorm
from executor_service.model.model_config import ModelConfig
from executor_service.model.rope import apply_rotation


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, hidden, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self.qkv = FusedLinear()
        self.split = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                      self.num_kv_heads * self.head_dim)

    def fuse_projections(self) -> None:
        self.qkv.fuse(self.q_proj, self.k_proj, self.v_proj)

    def pack_weights(self) -> None:
        self.qkv.pack()
        self.o_proj.pack()

    def project(self, hidden: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """query `[tokens, heads, head_dim]`, key and value `[tokens, kv_heads, head_dim]`,
        query and key rotated; `rotation` is the RoPE cos/sin of the tokens' positions
        (RotaryEmbedding.rotation). Pure tensor math: one of the compiled segments."""
        tokens = hidden.shape[0]
        query, key, value = self.qkv(hidden).split(self.split, dim=-1)
        query = query.view(tokens, self.num_heads, self.head_dim)
        key = key.view(tokens, self.num_kv_heads, self.head_dim)
        value = value.view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        query, key = apply_rotation(rotation, query, key)
        return query, key, value

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               key_cache: torch.Tensor, value_cache: torch.Tensor,
               batch: AttentionBatch) -> torch.Tensor:
        """The new K/V stored into their slots, then each query row over its sequence's
        cache: `[tokens, heads * head_dim]`, before o_proj. Runs eagerly (the kernels)."""
        kernels.store_kv(key, value, key_cache, value_cache, batch.slot_mapping)
        out = torch.empty_like(query)
        split = batch.num_decode_tokens
        if split:
            kernels.paged_decode_attention(
                query[:split], key_cache, value_cache, batch.decode_block_tables,
                batch.decode_context_lens, self.scale, max_context_len=batch.max_decode_context,
                out=out[:split])
        if batch.num_prefill_seqs:
            kernels.paged_prefill_attention(
                query[split:], key_cache, value_cache, batch.prefill_block_tables,
                batch.prefill_query_start, batch.prefill_seq_lens, self.scale,
                max_query_len=batch.max_prefill_query, max_seq_len=batch.max_prefill_seq,
                out=out[split:])
        return out.view(query.shape[0], self.num_heads * self.head_dim)
