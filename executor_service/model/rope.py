"""Rotary position embeddings, as a table of cos/sin per position computed once.

The frequencies are computed exactly as Hugging Face computes them (fp32, the same operation
order), so positions rotate bit-for-bit alike and greedy outputs can be compared token for
token. Rotation is the "rotate half" form Llama-family checkpoints are trained with: the first
and second halves of each head form the pairs.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from executor_service.model.model_config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim
    frequencies = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        return frequencies / rope.factor
    if rope.rope_type == "llama3":
        return llama3_rescale(frequencies, rope)
    return frequencies


def llama3_rescale(frequencies: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3's long-context rescaling: wavelengths longer than original / low_freq_factor are
    slowed down by `factor`, those shorter than original / high_freq_factor kept, and the band
    between interpolated smoothly."""
    original = rope.original_max_position_embeddings
    low_wavelength = original / rope.low_freq_factor
    high_wavelength = original / rope.high_freq_factor
    wavelength = 2 * math.pi / frequencies
    scaled = torch.where(wavelength > low_wavelength, frequencies / rope.factor, frequencies)
    smooth = (original / wavelength - rope.low_freq_factor) / \
        (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    in_band = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(in_band, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        frequencies = inverse_frequencies(rope, head_dim)
        positions = torch.arange(max_positions, dtype=torch.float)
        angles = positions[:, None] * frequencies[None, :]
        table = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", table.cos(), persistent=False)   # [positions, head_dim]
        self.register_buffer("sin", table.sin(), persistent=False)

    def rotation(self, positions: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[tokens, 1, head_dim]` of the positions: looked up once per forward
        pass and shared by every layer."""
        return (self.cos[positions].to(dtype)[:, None, :],
                self.sin[positions].to(dtype)[:, None, :])


def apply_rotation(rotation: tuple[torch.Tensor, torch.Tensor], query: torch.Tensor,
                   key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """query `[tokens, heads, head_dim]`, key `[tokens, kv_heads, head_dim]`, rotated."""
    cos, sin = rotation
    return query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)
