"""The torch build `make` installs (scripts/torch_backend.py): the CPU build without an NVIDIA
driver, a CUDA build the driver runs with one, or what TORCH_BACKEND says; and the Makefile
installs exactly that before the project. The driver is played by a stand-in `nvidia-smi` on
PATH: the one piece of hardware a test here cannot have."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from scripts.torch_backend import backend_for_driver, pip_arguments

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "torch_backend.py"
CPU_INDEX = ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


@pytest.mark.parametrize("driver, backend", [
    (None, "cpu"), ("580.159.03", "cu130"), ("590.10", "cu130"), ("570.86.10", "cu128"),
    ("525.60.13", "cu128"), ("470.256.02", "cpu"), ("garbage", "cpu"),
])
def test_the_driver_decides_the_build(driver, backend):
    assert backend_for_driver(driver)[0] == backend


def test_the_cpu_and_cuda_12_builds_come_from_pytorchs_index_and_cuda_13_from_pypi():
    assert pip_arguments("cpu") == CPU_INDEX
    assert pip_arguments("cu128") == ["--extra-index-url", "https://download.pytorch.org/whl/cu128"]
    assert pip_arguments("cu130") == []


def run_script(tmp_path: Path, *args: str, driver: str | None = None):
    """The script as make runs it, with a stand-in nvidia-smi reporting `driver` (or none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if driver is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho {driver}\n")
        smi.chmod(0o755)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": str(bin_dir)})


def test_auto_without_a_driver_takes_the_cpu_build(tmp_path):
    run = run_script(tmp_path, "auto")
    assert run.returncode == 0
    assert run.stdout.split() == CPU_INDEX
    assert "torch build: cpu (no NVIDIA driver found" in run.stderr


def test_auto_with_a_driver_takes_the_cuda_build_it_runs(tmp_path):
    run = run_script(tmp_path, driver="570.86.10")
    assert run.stdout.split() == ["--extra-index-url", "https://download.pytorch.org/whl/cu128"]
    assert "NVIDIA driver 570.86.10 runs CUDA 12.8" in run.stderr
    run = run_script(tmp_path, driver="580.159.03")
    assert run.returncode == 0 and run.stdout.split() == []


def test_the_variable_overrides_the_driver_and_a_bad_value_is_refused(tmp_path):
    run = run_script(tmp_path, "cpu", driver="580.159.03")
    assert run.stdout.split() == CPU_INDEX and "TORCH_BACKEND says so" in run.stderr
    run = run_script(tmp_path, "rocm")
    assert run.returncode == 2
    assert "TORCH_BACKEND must be auto or one of cpu, cu128, cu130, got 'rocm'" in run.stderr


def test_the_makefile_installs_the_chosen_torch_alone_before_the_project():
    makefile = (ROOT / "Makefile").read_text()
    pinned = next(spec for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())
                  ["project"]["dependencies"] if spec.startswith("torch"))
    assert pinned == "torch==" + re.search(r"^TORCH_VERSION\s*:=\s*(\S+)", makefile, re.M)[1]
    assert re.search(r"^TORCH_BACKEND\s*\?=\s*auto$", makefile, re.M)
    recipe = makefile[makefile.index("$(INSTALLED): pyproject.toml"):]
    torch_step = recipe.index("scripts/torch_backend.py $(TORCH_BACKEND)")
    # --no-deps: only torch is looked up on PyTorch's index; the registry serves the rest.
    assert "--no-deps $$torch_args" in recipe[torch_step:recipe.index("-e '.[dev]'")]
    assert torch_step < recipe.index("-e '.[dev]'")
