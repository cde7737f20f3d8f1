"""`python -m scripts.build_allocator_core`: compiles the allocator core with mypyc (`make
allocator-core`, run by `make run` and `make test`).

The core stays plain Python, and the Python files are the only source: mypyc turns the same
files into C extension modules, about 1.4× faster on the Step path (docs/architecture.md,
"Capacity of one allocator"). They are written under build/allocator-core/, never beside the
sources, with a manifest of the sources they were built from; allocator_service/core/__init__.py
imports them only while that manifest matches the files, so an edited core is never served by
an old build. Without mypy or a C compiler this prints why and exits 0: the Python core runs.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Importing the package must not need the build this script makes.
os.environ["PAGEDSERVE_ALLOCATOR_CORE"] = "python"

from allocator_service.core.compiled_build import (BUILD_DIR, COMPILED_MODULES, GROUP_NAME,
                                                   MANIFEST, current_manifest, is_current)

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    if is_current():
        return 0
    try:
        from mypyc.build import mypycify
        from setuptools import setup
    except ImportError as error:
        print(f"allocator core: not compiled ({error.name} is not installed); the Python core "
              "runs", file=sys.stderr)
        return 0
    sources = [str(ROOT / module.replace(".", "/")) + ".py" for module in COMPILED_MODULES]
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="allocator-core-") as scratch:
        os.chdir(scratch)  # setup() would read the project's pyproject.toml from the cwd
        try:
            extensions = mypycify(["--ignore-missing-imports", *sources],
                                  opt_level="3", group_name=GROUP_NAME, target_dir=scratch)
            setup(name="pagedserve-allocator-core", ext_modules=extensions,
                  script_args=["--quiet", "build_ext", "--build-lib", str(BUILD_DIR),
                               "--build-temp", scratch])
        except (SystemExit, Exception) as error:  # a compiler missing or failing
            shutil.rmtree(BUILD_DIR, ignore_errors=True)
            print(f"allocator core: not compiled ({error}); the Python core runs",
                  file=sys.stderr)
            return 0
    MANIFEST.write_text(json.dumps(current_manifest(), indent=1, sort_keys=True))
    print(f"allocator core: compiled into {BUILD_DIR.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
