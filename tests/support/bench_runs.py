"""Running a benchmark the way a user does (`python -m bench.<family>`), from any folder: the
tests run them from a temporary one, to prove they write nothing but their outputs."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# From the repository root `-m bench.<family>` finds the package by itself; from elsewhere the
# root goes on PYTHONPATH (bench/ is not installed: it is the repository's, not the product's).
BENCH_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
