"""Every benchmark's --quick mode runs, so a benchmark can never rot unnoticed (no timings
are asserted: the machine is shared and noisy)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from redis_process import REDIS_SERVER

ROOT = Path(__file__).resolve().parent.parent


def test_allocator_bench_quick_run_prints_its_table_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "allocator_bench.py"), "--quick"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
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
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "durability_bench.py"), "--quick",
                          "--data-dir", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
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
