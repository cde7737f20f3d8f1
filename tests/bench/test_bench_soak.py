"""`python -m bench.soak` runs end to end in a few seconds (`--quick`), so `make soak` can
never rot unnoticed: the stack starts, the load runs with its cancels, the allocator is killed and
restarted, every check passes, the section lands between its markers on the page it is told
(the rest of that page kept), and no process outlives the run. No timings are asserted."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak.report import BEGIN, END, write_section
from pagedserve.supervisor.redis_server import REDIS_SERVER
from pagedserve.supervisor.service_process import alive
from tests.support.bench_runs import BENCH_ENV

ROOT = Path(__file__).resolve().parents[2]


CHECKED_ROWS = ("allocator `kill -9` and restart on the same Redis",
                "requests that failed (neither finished nor given up)",
                "gateway's undisturbed greedy answers equal to the in-process engine's",
                "answers wrong (greedy: not the engine's; sampled: not max_tokens long)",
                "left once clients are gone",
                "`Audit` of the allocator")


@pytest.mark.skipif(shutil.which(REDIS_SERVER) is None, reason=f"needs {REDIS_SERVER}")
def test_soak_quick_run_passes_its_checks_writes_between_its_markers_and_stops_everything(
        tmp_path: Path) -> None:
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    out.mkdir()
    page = out / "reliability.md"
    page.write_text("# Reliability\n\nKept as it is.\n")
    real_page = (ROOT / "docs" / "reliability.md").read_bytes()
    run = subprocess.run([sys.executable, "-m", "bench.soak", "--quick",
                          "--out-md", str(page), "--out-png", str(out / "soak.png")],
                         cwd=cwd, env=BENCH_ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "soak passed" in run.stdout
    lines = run.stdout.splitlines()
    for metric in CHECKED_ROWS:
        line = next(line for line in lines if line.startswith(metric))
        assert line.split()[-1] == "yes", line
    assert "SERVING again after" in run.stdout

    stack = re.search(r"allocator pid (\d+), executor pid (\d+), gateway pid (\d+), "
                      r"redis pid (\d+)", run.stderr)
    assert stack is not None, run.stderr[-3000:]
    assert [pid for pid in map(int, stack.groups()) if alive(pid)] == []

    text = page.read_text()
    assert text.startswith("# Reliability\n\nKept as it is.\n\n<!-- soak:begin -->\n## Soak\n")
    assert text.rstrip().endswith("<!-- soak:end -->")
    assert "![soak memory](soak.png)" in text
    assert (out / "soak.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(path.name for path in out.iterdir()) == ["reliability.md", "soak.png"]
    assert list(cwd.iterdir()) == []
    assert (ROOT / "docs" / "reliability.md").read_bytes() == real_page


def test_the_soak_section_replaces_the_one_between_its_markers_and_nothing_else(
        tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\nbefore\n\n{BEGIN}\n## Soak\n\nold\n{END}\n\nafter\n")
    write_section(page, "## Soak\n\nnew\n")
    assert page.read_text() == f"# Page\n\nbefore\n\n{BEGIN}\n## Soak\n\nnew\n{END}\n\nafter\n"
