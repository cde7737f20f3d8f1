"""`python -m bench.sharing --quick` mode runs, so the benchmark can never rot unnoticed. No timings are
asserted (the machine is shared and noisy); block counts are, where sharing must show: they
depend on the schedule alone."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.bench_runs import BENCH_ENV

ROOT = Path(__file__).resolve().parents[2]

METRICS = ("parallel sampling n=2: KV blocks saved by fork (mean over the run)",
           "beam search: KV blocks saved",
           "shared system prompt (64 tokens): KV blocks saved by the prefix cache",
           "shared system prompt (64 tokens): output tokens/s, shared / not shared",
           "runs in which every request returned all its tokens (sanity check)",
           "preemptions in any run (sanity check: the cache held every run)",
           "greedy outputs equal with and without the prefix cache (sanity check)",
           "sampled choices equal to their unshared twin (same seeds)")


def run_quick(cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.sharing", "--quick", *flags], cwd=cwd,
                          env=BENCH_ENV, capture_output=True, text=True, timeout=180)


def line_starting(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_sharing_bench_quick_run_prints_its_tables_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = run_quick(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for metric in METRICS:
        assert metric in run.stdout
    assert line_starting(run.stdout, "beam search").split()[-1] == "—"
    # One round of each mode of 2 cases; greedy outputs of the 4 system prompt requests.
    assert line_starting(run.stdout, "runs in which every request").split()[-6:] == \
        ["4", "of", "4", "all", "4", "yes"]
    assert line_starting(run.stdout, "preemptions in any run").split()[-3:] == ["0", "0", "yes"]
    assert line_starting(run.stdout, "greedy outputs equal").split()[-6:] == \
        ["4", "of", "4", "all", "4", "yes"]
    assert "NO" not in run.stdout.split()
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


def test_sharing_bench_quick_run_writes_its_section_plot_and_raw_results_when_told(
        tmp_path: Path) -> None:
    run = run_quick(tmp_path, "--out-md", "out/bench.md", "--out-png", "out/sharing.png",
                    "--results-dir", "raw")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    page = (tmp_path / "out" / "bench.md").read_text()
    assert "\n## Sharing\n" in page
    assert "![sharing benchmark](sharing.png)" in page
    for metric in METRICS:
        assert metric in page
    assert (tmp_path / "out" / "sharing.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    raw = json.loads((tmp_path / "raw" / "sharing_bench.json").read_text())
    parallel, system = raw["cases"]
    assert (parallel["kind"], parallel["n"]) == ("parallel sampling", 2)
    assert system["kind"] == "shared system prompt"
    for case in (parallel, system):
        (unshared,), (shared,) = case["unshared"], case["shared"]
        assert unshared["preemptions"] == shared["preemptions"] == 0
        assert unshared["output_tokens"] == shared["output_tokens"]
        # Sharing must show in the blocks: fork shares the prompts' full blocks, the prefix
        # cache the system prompt's, so fewer are ever in use at once.
        assert shared["peak_blocks"] < unshared["peak_blocks"]
        assert shared["iteration_mean_blocks"] < unshared["iteration_mean_blocks"]
    # 4 prompts with n = 2, 8 tokens per choice; fork computes each prompt once instead of twice.
    assert parallel["unshared"][0]["output_tokens"] == 4 * 2 * 8
    assert parallel["unshared"][0]["prompt_tokens_computed"] == \
        2 * parallel["shared"][0]["prompt_tokens_computed"] == 2 * sum(parallel["prompt_lens"])
    # The 64-token system prompt is 4 blocks; every request after the first one served them
    # from the prefix cache (at most 64 tokens per iteration, so one is admitted at a time).
    assert system["unshared"][0]["cached_tokens"] == 0
    assert system["shared"][0]["cached_tokens"] == 3 * 64
    assert all(row["met"] is not False for row in raw["rows"])
