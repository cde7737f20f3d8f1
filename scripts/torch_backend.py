"""Which build of torch this machine should install, as pip arguments (`make` calls it first).

torch 2.13.0 on the public registry (PyPI) is the CUDA 13 build: over 3 GB with its nvidia-*
packages, and usable only with an NVIDIA driver of 580 or newer. A machine without an NVIDIA GPU
wants the CPU build (about 200 MB), an older driver a CUDA 12 build; both live on PyTorch's own
index, as `2.13.0+cpu` and `2.13.0+cu128`. Given that index as an extra one, pip takes them for
`torch==2.13.0`, because a local version label sorts above the plain release.

    python3 scripts/torch_backend.py [auto|cpu|cu128|cu130]   # TORCH_BACKEND in the Makefile

prints the pip arguments for that build on stdout, and on stderr what it chose and why. auto (the
default) asks `nvidia-smi` for the driver: none -> cpu; 580 or newer -> cu130, from PyPI itself;
525 or newer -> cu128 (CUDA 12 runs on any 525+ driver through minor-version compatibility);
older -> cpu, saying the driver is too old. Standard library only: it runs before any venv.
"""
from __future__ import annotations

import subprocess
import sys

PYTORCH_INDEX = "https://download.pytorch.org/whl"
BACKENDS = ("cpu", "cu128", "cu130")
# The oldest driver each CUDA build runs on (NVIDIA's CUDA release notes; 12.x by minor-version
# compatibility).
MIN_DRIVER = {"cu130": 580, "cu128": 525}


def driver_version() -> str | None:
    """The NVIDIA driver's version (e.g. "580.159.03"), or None without one."""
    try:
        run = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = run.stdout.split()
    return lines[0] if run.returncode == 0 and lines else None


def backend_for_driver(driver: str | None) -> tuple[str, str]:
    """(backend, why) for a driver version, or for no NVIDIA driver at all."""
    if driver is None:
        return "cpu", "no NVIDIA driver found (nvidia-smi)"
    try:
        major = int(driver.split(".")[0])
    except ValueError:
        return "cpu", f"nvidia-smi reported an unreadable driver version {driver!r}"
    for backend in ("cu130", "cu128"):
        if major >= MIN_DRIVER[backend]:
            return backend, f"NVIDIA driver {driver} runs CUDA {backend[2:-1]}.{backend[-1]}"
    return "cpu", (f"NVIDIA driver {driver} is older than {MIN_DRIVER['cu128']}, the oldest "
                   "any CUDA build of torch 2.13 runs on: update it, or set TORCH_BACKEND")


def pip_arguments(backend: str) -> list[str]:
    """What `pip install ... torch==VERSION` needs for that build. cu130 is PyPI's own."""
    if backend == "cu130":
        return []
    return ["--extra-index-url", f"{PYTORCH_INDEX}/{backend}"]


def main(argv: list[str]) -> int:
    choice = argv[0] if argv else "auto"
    if choice == "auto":
        backend, why = backend_for_driver(driver_version())
    elif choice in BACKENDS:
        backend, why = choice, "TORCH_BACKEND says so"
    else:
        print(f"TORCH_BACKEND must be auto or one of {', '.join(BACKENDS)}, got {choice!r}",
              file=sys.stderr)
        return 2
    print(f"torch build: {backend} ({why})", file=sys.stderr)
    print(" ".join(pip_arguments(backend)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
