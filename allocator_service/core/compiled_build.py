"""Where the mypyc build of the allocator core lives, and whether it matches the sources.

`make allocator-core` (scripts/build_allocator_core.py) compiles the core's hot modules into
build/allocator-core/ with a manifest of the sources they came from. The package's __init__
asks `compiled_package_dir()` whether to import them instead of the Python files: only while
every source is byte for byte what was compiled, for this Python's extension ABI. The
environment variable PAGEDSERVE_ALLOCATOR_CORE chooses: `auto` (the default: compiled when a
current build exists), `python`, or `compiled` (refuse to start without a current build).
"""
from __future__ import annotations

import json
import os
import sysconfig
from hashlib import sha256
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = ROOT / "build" / "allocator-core"
MANIFEST = BUILD_DIR / "manifest.json"
# mypyc's shared library becomes allocator_service.core.compiled__mypyc, inside the package.
GROUP_NAME = "allocator_service.core.compiled"
# The modules a Step runs through, and the audit (it holds the state lock a pool at a time, so
# its speed is Steps' waiting); the rest of the core (inspection, errors) is not hot.
COMPILED_MODULES = tuple(f"allocator_service.core.{name}" for name in (
    "allocator", "audit", "block", "block_hash", "block_pool", "executor_pool",
    "free_block_queue", "hash_index", "kv_events", "sequence", "step_wire", "validation"))
CHOICE_ENV = "PAGEDSERVE_ALLOCATOR_CORE"


def current_manifest() -> dict[str, object]:
    """What a build of the present sources records."""
    return {"ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
            "sources": {module: sha256(_source(module).read_bytes()).hexdigest()
                        for module in COMPILED_MODULES}}


def is_current() -> bool:
    try:
        return bool(json.loads(MANIFEST.read_text()) == current_manifest())
    except (OSError, ValueError):
        return False


def compiled_package_dir() -> Path | None:
    """The directory to import the compiled core modules from, or None for the Python ones."""
    choice = os.environ.get(CHOICE_ENV, "auto")
    if choice not in ("auto", "python", "compiled"):
        raise ImportError(f"{CHOICE_ENV}={choice!r}: expected auto, python or compiled")
    if choice == "python":
        return None
    if is_current():
        return BUILD_DIR / "allocator_service" / "core"
    if choice == "compiled":
        raise ImportError(f"{CHOICE_ENV}=compiled but no build of the present allocator core "
                          f"is in {BUILD_DIR}: run `make allocator-core`")
    return None


def core_description() -> str:
    """Which core this process runs, for the allocator's start-up log."""
    compiled = compiled_package_dir()
    if compiled is not None:
        return f"compiled (mypyc, {BUILD_DIR})"
    if os.environ.get(CHOICE_ENV) == "python":
        return f"interpreted ({CHOICE_ENV}=python)"
    return f"interpreted (no current build in {BUILD_DIR}: `make allocator-core` makes one)"


def _source(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")
