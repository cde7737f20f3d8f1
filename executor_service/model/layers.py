"""The building blocks every supported architecture shares: RMSNorm, the SwiGLU MLP, and the
linear layers they are made of (packable for oneDNN on the CPU: packed_linear.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from executor_service.model.packed_linear import PackedLinear, linear, pack_if_supported


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and cast back, as the checkpoints were trained."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up as one matmul once fuse_projections ran."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.gate_up = FusedLinear()

    def fuse_projections(self) -> None:
        self.gate_up.fuse(self.gate_proj, self.up_proj)

    def pack_weights(self) -> None:
        self.gate_up.pack()
        self.down_proj.pack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Linear(nn.Linear):
    """nn.Linear that runs through a oneDNN-packed copy of its weight once `pack` ran (on the
    CPU; elsewhere `pack` leaves it as it was)."""

    packed: PackedLinear | None = None

    def pack(self) -> None:
        self.packed = pack_if_supported(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


class FusedLinear(nn.Module):
    """Several linear layers over the same input as one matmul, their outputs side by side.

    Checkpoints name each projection apart (q_proj, k_proj, ...), so they are loaded into
    their own nn.Linear first; `fuse` then concatenates the weights and points every part's
    parameters at its rows of the whole, so the parts keep their names (and can still be
    read by name) without a second copy of the weights. One wide matmul instead of two or
    three narrow ones: fewer calls into BLAS per layer, each with more columns to block.
    """

    packed: PackedLinear | None = None

    def __init__(self) -> None:
        super().__init__()
        # Buffers, not parameters: the parts own the parameters; buffers still follow .to().
        self.register_buffer("weight", None, persistent=False)
        self.register_buffer("bias", None, persistent=False)

    def fuse(self, *parts: nn.Linear) -> None:
        with torch.no_grad():
            self.weight = torch.cat([part.weight for part in parts])
            if parts[0].bias is not None:
                self.bias = torch.cat([part.bias for part in parts])
        start = 0
        for part in parts:
            rows = part.weight.shape[0]
            part.weight = nn.Parameter(self.weight[start:start + rows], requires_grad=False)
            if self.bias is not None:
                part.bias = nn.Parameter(self.bias[start:start + rows], requires_grad=False)
            start += rows

    def pack(self) -> None:
        self.packed = pack_if_supported(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            raise RuntimeError("FusedLinear used before fuse(): load_model fuses projections")
        return linear(x, self.weight, self.bias, self.packed)
