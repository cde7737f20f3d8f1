"""Why a benchmark asked for a CUDA device cannot honestly run here: shared by the engine
benchmarks, which time our Triton kernels and must not time them interpreted."""
from __future__ import annotations

import sys

import torch

from kernels.triton_support import interpreting


def refusal(device: str) -> str | None:
    """Why this machine cannot run on `device`, or None."""
    if not device.startswith("cuda"):
        return None
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if interpreting():
        return "TRITON_INTERPRET is set, so the engine's Triton kernels would be interpreted"
    return None


def refused(script: str, device: str) -> bool:
    """True, having said why on stderr, when `script` cannot honestly run on `device` here."""
    why = refusal(device)
    if why is not None:
        print(f"{script} was asked for {device}, and {why}. Nothing was written.",
              file=sys.stderr)
    return why is not None
