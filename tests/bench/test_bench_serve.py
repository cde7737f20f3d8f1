"""`python -m bench.serve --quick` mode runs end to end, so the serving benchmark can never rot unnoticed:
the whole stack starts, every contender serves, the sanity checks pass, the outputs go exactly
where they are told, and no service outlives the benchmark. No timings are asserted: the
machine is shared and noisy."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from pagedserve.supervisor.service_process import alive
from tests.support.bench_runs import BENCH_ENV

ROOT = Path(__file__).resolve().parents[2]

SANITY_ROWS = {
    # 8 requests of 8 tokens, served by 3 contenders.
    "requests that returned exactly their requested tokens, every run (sanity check)":
        ["24", "of", "24", "all", "24", "yes"],
    "requests whose greedy tokens through gRPC equal the in-process engine's":
        ["8", "of", "8", "all", "8", "yes"],
    "requests whose greedy text through HTTP equals gRPC's": ["8", "of", "8", "all", "8", "yes"],
}
ROWS = ("full stack (gRPC) / in-process engine, output tokens/s at 4 concurrent streams",
        "full stack (HTTP) / in-process engine, output tokens/s at 4 concurrent streams",
        "in-process engine: output tokens/s at rate ∞ (best of 1)",
        "full stack, gRPC: output tokens/s at rate ∞ (best of 1)",
        "full stack, HTTP: output tokens/s at rate ∞ (best of 1)",
        "full stack, gRPC: CPU µs per output token at rate ∞")


def test_serve_bench_quick_run_passes_its_sanity_checks_writes_only_where_told_and_stops_the_stack(
        tmp_path: Path) -> None:
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    docs = ROOT / "docs"
    before = (docs / "benchmarks.md").read_bytes()
    default_png = docs / "img" / "serve_bench.png"
    png_before = default_png.read_bytes() if default_png.exists() else None
    run = subprocess.run(
        [sys.executable, "-m", "bench.serve", "--quick",
         "--out-md", str(out / "benchmarks.md"), "--out-png", str(out / "serve.png"),
         "--results-dir", str(out)],
        cwd=cwd, env=BENCH_ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    lines = run.stdout.splitlines()
    for metric in ROWS:
        assert any(line.startswith(metric) for line in lines), metric
    for metric, ending in SANITY_ROWS.items():
        line = next(line for line in lines if line.startswith(metric))
        assert line.split()[-len(ending):] == ending, line
    for heading in ("TTFT median (ms)", "TPOT p99 (ms)", "ITL mean (ms)", "benchmark (µs/token)",
                    "gateway (µs/token)"):
        assert heading in run.stdout

    # The services the benchmark started are gone.
    stack = re.search(r"allocator pid (\d+), executor pid (\d+), gateway pid (\d+)", run.stderr)
    assert stack is not None, run.stderr[-3000:]
    assert [pid for pid in map(int, stack.groups()) if alive(pid)] == []

    # Written where told, and nowhere else.
    page = (out / "benchmarks.md").read_text()
    assert "## Serving" in page and "![serving benchmark](serve.png)" in page
    assert (out / "serve.png").stat().st_size > 0
    results = json.loads((out / "serve_bench.json").read_text())
    assert [run["contender"] for run in results["runs"]] == ["engine", "grpc", "http"]
    assert all(run["output_tokens"] == 64 for run in results["runs"])
    assert sorted(path.name for path in out.iterdir()) == [
        "benchmarks.md", "serve.png", "serve_bench.json"]
    assert list(cwd.iterdir()) == []
    assert (docs / "benchmarks.md").read_bytes() == before
    assert (default_png.read_bytes() if default_png.exists() else None) == png_before
