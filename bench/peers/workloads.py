"""The checkpoints the benchmarks against peers serve (bench/peers, bench/beam): `embedded`,
pagedserve's embedded default, where the serving overhead dominates, and `mid`, a 64M-parameter
Llama with random weights (checkpoint.py), where the matmuls dominate."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.peers import checkpoint
from executor_service.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir

WORKLOADS = ("embedded", "mid")


def parse_workloads(text: str) -> tuple[str, ...]:
    """A comma-separated --workloads value, as an argparse type."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"workloads are {', '.join(WORKLOADS)}; got {text!r}")
    return names


def workload_model(name: str) -> tuple[Path, str]:
    """The workload's checkpoint directory (the mid one is written on first use) and what it
    is, in words."""
    if name == "embedded":
        return embedded_model_dir(), f"{EMBEDDED_MODEL_NAME} (the embedded default)"
    print("mid-size checkpoint (written on first use) ...", file=sys.stderr)
    return checkpoint.checkpoint_dir(), f"{checkpoint.RECIPE.name} (random weights)"
