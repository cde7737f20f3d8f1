"""Linear layers on the CPU through oneDNN, with each weight reordered once at load.

Why: torch's `F.linear` on the CPU calls MKL's sgemm, and MKL takes its AVX2 code path on AMD
processors. oneDNN, which torch also ships, uses AVX-512 there. On this project's AMD EPYC
machines a packed oneDNN linear is 2.0-2.3x faster than `F.linear` for every decode-sized
layer of the embedded and mid checkpoints (64 x 256 x 1408: 181 vs 413 us, one thread;
docs/kernels.md). A weight "packed" for oneDNN is reordered into its blocked layout ahead of
time, so no call pays for that reordering. Inductor does the same when it freezes a model on
the CPU.

The packed copy sits beside the plain weight, which stays as it is: the parameters keep
their checkpoint names and values, the embedding still reads a tied matrix, and a device that
cannot use packing runs the plain path. The packed copy doubles the weights' memory on the CPU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# oneDNN picks its blocking for this many rows; any row count still works (1 to thousands
# checked in tests/executor/test_packed_linear.py). 64 is the peer benchmark's decode batch.
BATCH_HINT = 64
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# A oneDNN call costs about 10 us more than an MKL one before any arithmetic, so a product
# smaller than this many multiply-adds (rows x in x out) is faster through F.linear: measured
# break-even between 0.36 and 0.52 M across the checkpoints' shapes. A decode of one or two
# sequences on the embedded model stays on MKL; anything larger goes to oneDNN.
PACKED_MIN_MACS = 1 << 19


def packing_supported(weight: torch.Tensor) -> bool:
    """oneDNN packing applies to float32 and bfloat16 CPU weights, when torch has oneDNN."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE_DTYPES:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    return weight.dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear:
    """`x @ weight.T + bias` for 2-D `x`, through a oneDNN-packed copy of `weight`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        if not packing_supported(weight):
            raise ValueError(f"a {weight.dtype} weight on {weight.device} cannot be packed "
                             "for oneDNN")
        with torch.no_grad():
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)
        self.bias = None if bias is None else bias.detach()
        self.macs_per_row = weight.shape[0] * weight.shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def pack_if_supported(weight: torch.Tensor, bias: torch.Tensor | None) -> PackedLinear | None:
    return PackedLinear(weight, bias) if packing_supported(weight) else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: PackedLinear | None) -> torch.Tensor:
    """The packed path when the layer has one and `x` is big enough to gain from it;
    `F.linear` otherwise (GPU, float16, no oneDNN, a tiny batch)."""
    if packed is not None and x.shape[0] * packed.macs_per_row >= PACKED_MIN_MACS:
        return packed(x)
    return F.linear(x, weight, bias)
