"""Every benchmark's --quick mode runs, so a benchmark can never rot unnoticed (no timings
are asserted: the machine is shared and noisy)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagedserve.supervisor.redis_server import REDIS_SERVER
from tests.support.bench_runs import BENCH_ENV

ROOT = Path(__file__).resolve().parents[2]



def test_allocator_bench_quick_run_prints_its_table_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = subprocess.run([sys.executable, "-m", "bench.allocator", "--quick"],
                         cwd=tmp_path, env=BENCH_ENV, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    for metric in ("core: serving mix through `Allocator.step` (block ops/s)",
                   "gRPC: batched / one RPC per op",
                   "`Step` latency, 256 appends, loopback: p50",
                   "ops whose result was not OK (sanity check)"):
        assert metric in run.stdout
    sanity = next(line for line in run.stdout.splitlines() if line.startswith("ops whose result"))
    assert sanity.split()[-3:] == ["0", "0", "yes"], sanity
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which(REDIS_SERVER) is None, reason=f"needs {REDIS_SERVER}")
def test_durability_bench_quick_run_prints_its_tables_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = subprocess.run([sys.executable, "-m", "bench.durability", "--quick",
                          "--data-dir", str(tmp_path)],
                         cwd=tmp_path, env=BENCH_ENV, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    for metric in ("256-op `Step` p50 over loopback: durable/memory, appendfsync everysec",
                   "256-op `Step` p50 over loopback: durable/memory, appendfsync always",
                   "serving mix ops/s: durable/memory",
                   "snapshot size in Redis",
                   "256-op Step p50: durable/memory = ",
                   "ops whose result was not OK (sanity check)"):
        assert metric in run.stdout
    for recovery_point in ("registration only", "snapshot after "):
        assert any(line.startswith(recovery_point) for line in run.stdout.splitlines())
    sanity = next(line for line in run.stdout.splitlines() if line.startswith("ops whose result"))
    assert sanity.split()[-3:] == ["0", "0", "yes"], sanity
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    # The redis-servers' files went with their temporary directory; nothing else was written.
    assert list(tmp_path.iterdir()) == []


def test_throughput_bench_quick_run_prints_its_table_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = subprocess.run([sys.executable, "-m", "bench.throughput", "--quick"],
                         cwd=tmp_path, env=BENCH_ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for metric in ("pagedserve engine (in-process): output tokens/s",
                   "ours / transformers static `generate` (batch 4), output tokens/s",
                   "ours / transformers `generate_batch`, output tokens/s",
                   "ours: allocator stalls (decodes that waited for their slot) / decodes",
                   "requests whose greedy tokens equal ours: transformers static `generate`",
                   "requests whose greedy tokens equal ours: transformers `generate_batch`",
                   "output tokens every run returned (sanity check)"):
        assert metric in run.stdout
    # 8 requests of 8 tokens, from every contender.
    sanity = next(line for line in run.stdout.splitlines()
                  if line.startswith("output tokens every run returned"))
    assert sanity.split()[-3:] == ["64", "64", "yes"], sanity
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


KERNEL_METRICS = ("device copy bandwidth, `dst.copy_(src)`",
                  "decode bandwidth at batch",
                  "worst paged/SDPA decode time ratio, block ≥ 16",
                  "paged/SDPA causal prefill time ratio",
                  "paged outputs matching SDPA on the same K/V (sanity check)")


def run_kernels_bench_quick(cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    # Its --quick runs the Triton kernels (interpreted without a GPU) and checks each paged
    # output against SDPA's, exiting non-zero on a mismatch.
    pytest.importorskip("triton")
    return subprocess.run([sys.executable, "-m", "bench.kernels", "--quick", *flags], cwd=cwd,
                          env=BENCH_ENV, capture_output=True, text=True, timeout=120)


def test_kernels_bench_quick_run_prints_its_tables_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = run_kernels_bench_quick(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for metric in KERNEL_METRICS:
        assert metric in run.stdout
    assert "achieved GB/s" in run.stdout and "paged TFLOP/s" in run.stdout
    sanity = next(line for line in run.stdout.splitlines()
                  if line.startswith("paged outputs matching SDPA"))
    assert sanity.split()[-1] == "yes", sanity
    assert "MISMATCH" not in run.stdout
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


def test_kernels_bench_quick_run_writes_its_section_plot_and_raw_results_when_told(
        tmp_path: Path) -> None:
    run = run_kernels_bench_quick(tmp_path, "--out-md", "out/bench.md", "--out-png",
                                  "out/kernels.png", "--results-dir", "raw")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    page = (tmp_path / "out" / "bench.md").read_text()
    assert "\n## Kernels\n" in page
    assert "![kernels benchmark](kernels.png)" in page
    for metric in KERNEL_METRICS:
        assert metric in page
    assert (tmp_path / "out" / "kernels.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    raw = json.loads((tmp_path / "raw" / "kernels_bench.json").read_text())
    assert raw["decode"] and raw["prefill"]
    assert all(row["close"] for row in raw["decode"] + raw["prefill"])


@pytest.mark.parametrize("flags", [[], ["--targets"]], ids=["full", "targets"])
def test_kernels_bench_gpu_runs_without_a_gpu_refuse_and_write_nothing(tmp_path: Path,
                                                                     flags) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the run would really run")
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = subprocess.run([sys.executable, "-m", "bench.kernels", "--results-dir", "raw", *flags],
                         cwd=tmp_path, env=BENCH_ENV, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "CUDA GPU" in run.stderr and "Nothing was written" in run.stderr
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


def test_kernels_bench_targets_preset_is_the_full_runs_target_points() -> None:
    from bench.kernels.config import FULL, TARGET_BLOCK_SIZE, TARGETS

    assert (TARGETS.batches, TARGETS.contexts) == ((FULL.target_batch,), (FULL.target_context,))
    # The ratio target holds at every block size, so every one is measured.
    assert TARGETS.block_sizes == FULL.block_sizes and TARGET_BLOCK_SIZE in TARGETS.block_sizes
    assert (TARGETS.num_q_heads, TARGETS.num_kv_heads, TARGETS.head_dim) == \
        (FULL.num_q_heads, FULL.num_kv_heads, FULL.head_dim)
    assert TARGETS.decode_combos == len(FULL.block_sizes) and TARGETS.prefill_combos == 1
