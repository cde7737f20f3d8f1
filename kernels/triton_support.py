"""What the Triton launchers need to know about where their kernels run.

Under `TRITON_INTERPRET=1` (the CPU tests) kernels run on numpy, which has no bfloat16: arithmetic
on a bf16 tensor and `tl.dot` of bf16 operands give garbage there. The kernels therefore do all
arithmetic in fp32 anyway, and a `UPCAST_DOT` constexpr widens dot operands to fp32 only when
interpreting bf16; compiled kernels keep bf16/fp16 tensor-core dots with fp32 accumulation.
"""
from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (decided when a kernel is defined)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def upcast_dot(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16 and interpreting()


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 caches get exact fp32 dots; the default would round operands to TF32 (10-bit
    mantissa), far outside what an fp32 cache promises. Other dtypes ignore the setting."""
    return "ieee" if dtype == torch.float32 or upcast_dot(dtype) else "tf32"


def next_power_of_2(value: int) -> int:
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


@functools.cache
def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors to fill; the interpreter gets a small stand-in so tests still
    take the split paths."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
