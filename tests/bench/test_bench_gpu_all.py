"""bench/gpu_all.sh, the one command for a GPU machine: it cannot run here, so what it would run
is checked instead: every command it prints parses with its script's own argument parser, and
without a GPU it refuses and writes nothing."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_all.sh"
BENCHMARKS = {"bench.kernels", "bench.throughput", "bench.serve"}

# Each benchmark's parse_args, in a child process: importing one may set TRITON_INTERPRET.
PARSE = """
import importlib
import sys
module = importlib.import_module(sys.argv[1] + ".__main__")
args = module.parse_args(sys.argv[2:])
mode = "quick" if args.quick else "targets" if getattr(args, "targets", False) else "full"
print(args.out_md, args.out_png, args.results_dir, mode)
"""


def printed_commands(*flags: str, results: Path) -> list[list[str]]:
    run = subprocess.run(["bash", str(SCRIPT), *flags, "--print-commands", str(results)],
                         capture_output=True, text=True, timeout=30, check=True)
    return [shlex.split(line) for line in run.stdout.splitlines()]


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_every_printed_command_parses_with_its_scripts_own_parser(tmp_path: Path,
                                                                   quick: bool) -> None:
    results = tmp_path / "results"
    commands = printed_commands(*(["--quick"] if quick else []), results=results)
    assert all(command[1] == "-m" for command in commands)
    assert {command[2] for command in commands} == BENCHMARKS
    for command in commands:
        parsed = subprocess.run([sys.executable, "-c", PARSE, command[2], *command[3:]],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert parsed.returncode == 0, f"{shlex.join(command)}\n{parsed.stderr[-2000:]}"
        out_md, out_png, results_dir, mode = parsed.stdout.split()
        # Everything lands in the results folder, nothing in docs/.
        assert out_md == str(results / "benchmarks.md")
        assert Path(out_png).parent == results and out_png.endswith(".png")
        assert results_dir == str(results)
        # A quick run measures the kernels' target points: their smoke shapes mean nothing.
        expected = "full" if not quick else "targets" if command[2] == "bench.kernels" \
            else "quick"
        assert mode == expected
    assert not results.exists()


def test_without_a_gpu_it_refuses_and_writes_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would really run")
    results = tmp_path / "results"
    run = subprocess.run(["bash", str(SCRIPT), str(results)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert run.returncode == 2
    assert "no CUDA GPU" in run.stderr and "Nothing was written" in run.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_a_results_folder_it_says_how_to_call_it() -> None:
    run = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 64
    assert "usage: bench/gpu_all.sh" in run.stderr
