"""docs/reliability.md's bad-input table is current, and holds the 40 inputs issue 8 asks for."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bad_input_table_is_current_and_holds_at_least_40_inputs() -> None:
    check = subprocess.run([sys.executable, "-m", "scripts.gen_bad_input_table", "--check"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, (
        f"docs/reliability.md's bad-input table is stale; run `make docs`\n"
        f"{check.stdout}{check.stderr}")
    count = int(check.stdout.split()[0])
    assert count >= 40
