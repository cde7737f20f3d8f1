"""scripts/device_check.sh, the one command for a lent GPU machine. It cannot run here, so what it
depends on is checked instead: without a GPU it refuses and writes nothing; every dependency of
the project is either carried as a wheel (scripts/device_wheels.txt) or already on that machine;
the files it hands to `pytest -m gpu` are exactly those holding gpu tests, and they (with
tests/conftest.py) import with the packages that machine lacks made unimportable."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_check.sh"
WHEEL_LIST = ROOT / "scripts" / "device_wheels.txt"

# What the lent GPU machine's image has of our dependencies (the device tool's package list),
# so it needs no wheel for them. A new dependency must land here or in device_wheels.txt.
ON_THE_GPU_IMAGE = {
    "torch", "triton", "transformers", "numpy", "grpcio", "protobuf", "safetensors", "tokenizers",
    "jinja2", "matplotlib", "tqdm", "prometheus-client", "httpx", "pytest", "pytest-timeout",
    "hypothesis", "pyyaml", "anyio", "h11", "click", "typing-extensions", "psutil", "uvloop",
}
# Top-level modules of what it lacks and no wheel brings for the gpu tests: carried or not, the
# gpu test files must import without them.
MISSING_THERE = ("grpc_health", "grpc_reflection", "starlette", "uvicorn", "redis", "hiredis",
                 "openai", "cryptography")

# Installed first thing by a sitecustomize.py on PYTHONPATH: every import of a blocked module,
# or of one of its submodules, fails as it would on the GPU machine.
BLOCKER = """
import sys

BLOCKED = {blocked!r}


class BlockMissingPackages:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not on the GPU machine")
        return None


sys.meta_path.insert(0, BlockMissingPackages())
"""


def normalized(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): Jinja2 == jinja2, prometheus_client
    == prometheus-client."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_dependencies() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {normalized(re.match(r"[A-Za-z0-9._-]+", spec).group())
            for spec in pyproject["project"]["dependencies"]}


def carried_wheels() -> dict[str, str]:
    """name -> pinned version of each line of scripts/device_wheels.txt."""
    pins = {}
    for line in WHEEL_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, separator, version = line.partition("==")
            assert separator and re.fullmatch(r"[0-9][0-9a-z.]*", version), \
                f"{line!r}: pin each wheel to one version (name==version)"
            pins[normalized(name)] = version
    return pins


def gpu_test_files() -> list[str]:
    run = subprocess.run(["bash", str(SCRIPT), "--print-test-files"], capture_output=True,
                         text=True, timeout=30, check=True)
    return run.stdout.split()


def blocking_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(MISSING_THERE)))
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(tmp_path)}


def test_without_a_gpu_it_refuses_and_writes_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would really run")
    results, scratch = tmp_path / "results", tmp_path / "scratch"
    scratch.mkdir()
    run = subprocess.run(["bash", str(SCRIPT), str(results)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                              "TMPDIR": str(scratch)})
    assert run.returncode == 2
    assert f"no CUDA GPU is visible to {sys.executable}" in run.stderr
    assert "Nothing was written" in run.stderr
    # Not even the wheels were installed.
    assert sorted(tmp_path.iterdir()) == [scratch] and list(scratch.iterdir()) == []


def test_with_more_than_a_results_folder_it_says_how_to_call_it() -> None:
    run = subprocess.run(["bash", str(SCRIPT), "one", "two"], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 64
    assert "usage: scripts/device_check.sh" in run.stderr


def test_every_dependency_is_carried_as_a_wheel_or_already_on_the_gpu_image() -> None:
    carried = carried_wheels()
    undecided = project_dependencies() - carried.keys() - ON_THE_GPU_IMAGE
    assert not undecided, (f"{sorted(undecided)}: add each to scripts/device_wheels.txt, or to "
                           "ON_THE_GPU_IMAGE if the GPU machine has it")
    assert not carried.keys() & ON_THE_GPU_IMAGE


def test_the_grpc_wheels_hold_gencode_every_protobuf_runtime_imports() -> None:
    # 1.62 holds protobuf-4.25 gencode, like our own stubs (Makefile: GRPCIO_TOOLS).
    carried = carried_wheels()
    assert carried["grpcio-health-checking"] == carried["grpcio-reflection"] == "1.62.3"


def test_the_wheels_and_the_results_stay_out_of_git() -> None:
    run = subprocess.run(["git", "check-ignore", "--no-index", ".device-wheels/a.whl",
                          "device-results/summary.txt"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert run.stdout.split() == [".device-wheels/a.whl", "device-results/summary.txt"]


def test_the_files_it_tests_are_exactly_those_holding_gpu_tests() -> None:
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                          "-p", "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    holding_gpu_tests = {line.partition("::")[0] for line in run.stdout.splitlines()
                         if "::" in line}
    assert sorted(holding_gpu_tests) == gpu_test_files()


def test_the_blocker_makes_the_missing_packages_unimportable(tmp_path: Path) -> None:
    """Proves the check below is real: with the blocker on, what the venv has fails."""
    run = subprocess.run([sys.executable, "-c", "import redis.client"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env=blocking_env(tmp_path))
    assert run.returncode == 1
    assert "ImportError: redis is not on the GPU machine" in run.stderr


def test_the_gpu_tests_import_without_what_the_gpu_machine_lacks(tmp_path: Path) -> None:
    files = gpu_test_files()
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                          "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True,
                         text=True, timeout=240, env=blocking_env(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    collected_from = {line.partition("::")[0] for line in run.stdout.splitlines() if "::" in line}
    assert sorted(collected_from) == files
