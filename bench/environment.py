"""What a GPU run's results are read against: when, which commit, which GPU and driver, which
Python and which versions of the packages that matter. bench/gpu_all.sh and
scripts/device_check.sh write it into their results folder as environment.txt:

    python -m bench.environment [DISTRIBUTION ...]    # more distributions to report

Versions are those of the distributions Python would import here (a wheel installed onto
PYTHONPATH wins over the machine's own); "missing" for one it cannot find.
"""
from __future__ import annotations

import datetime
import platform
import subprocess
import sys
from importlib import metadata

# Beside torch (on the python line): our kernels' compiler, the baseline, the wire.
DISTRIBUTIONS = ("triton", "transformers", "grpcio", "protobuf")


def command_output(*command: str) -> str | None:
    """The command's output, or None when it is missing or fails (no git, no nvidia-smi)."""
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "missing"


def facts(extra_distributions: list[str]) -> list[str]:
    import torch

    now = datetime.datetime.now(datetime.timezone.utc)
    gpus = command_output("nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader")
    return [f"date: {now:%Y-%m-%dT%H:%MZ}",
            f"commit: {command_output('git', 'rev-parse', '--short', 'HEAD') or 'unknown'}",
            f"gpu: {gpus or 'none (nvidia-smi missing or failed)'}",
            f"python {platform.python_version()} | torch {torch.__version__} | "
            f"cuda {torch.version.cuda}",
            *(f"{name} {version(name)}" for name in (*DISTRIBUTIONS, *extra_distributions))]


if __name__ == "__main__":
    print("\n".join(facts(sys.argv[1:])))
