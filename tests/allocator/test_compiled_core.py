"""The allocator core compiled with mypyc (`make allocator-core`) is the same core: it answers
every step, event and snapshot exactly as the Python modules do, and it is used only while it
was built from the sources as they are."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import allocator_service.core.block_pool as block_pool
from allocator_service.core import compiled_build
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
needs_build = pytest.mark.skipif(
    not compiled_build.is_current(), reason="no current build: `make allocator-core` runs it")


def core_trace(choice: str, seed: int) -> str:
    env = {**os.environ, compiled_build.CHOICE_ENV: choice}
    return subprocess.run([sys.executable, "-m", "tests.support.core_trace", str(seed)], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True).stdout


@needs_build
def test_the_compiled_modules_are_imported_while_the_build_matches_the_sources():
    if os.environ.get(compiled_build.CHOICE_ENV) == "python":
        pytest.skip("the Python core was chosen for this run")
    # An extension module from the build. (Not its exact path: a module first imported by
    # another compiled module gets its path from mypyc, which guesses it wrong.)
    origin = Path(block_pool.__spec__.origin)
    assert origin.name.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    assert compiled_build.BUILD_DIR in origin.parents


@needs_build
@pytest.mark.parametrize("seed", [1, 2])
def test_the_compiled_core_answers_what_the_python_core_answers(seed):
    python, compiled = core_trace("python", seed), core_trace("compiled", seed)
    trace = json.loads(python)
    assert len(trace["answers"]) >= 400 and trace["events"]
    assert compiled == python


def test_an_edited_source_turns_the_build_off(tmp_path, monkeypatch):
    manifest = compiled_build.current_manifest()
    manifest["sources"]["allocator_service.core.block_pool"] = "0" * 64
    stale = tmp_path / "manifest.json"
    stale.write_text(json.dumps(manifest))
    monkeypatch.setattr(compiled_build, "MANIFEST", stale)
    monkeypatch.delenv(compiled_build.CHOICE_ENV, raising=False)
    assert compiled_build.compiled_package_dir() is None
    monkeypatch.setenv(compiled_build.CHOICE_ENV, "compiled")
    with pytest.raises(ImportError, match="make allocator-core"):
        compiled_build.compiled_package_dir()
    stale.write_text(json.dumps(compiled_build.current_manifest()))
    assert compiled_build.compiled_package_dir() == (
        compiled_build.BUILD_DIR / "allocator_service" / "core")


def test_the_python_core_can_be_chosen(monkeypatch):
    monkeypatch.setenv(compiled_build.CHOICE_ENV, "python")
    assert compiled_build.compiled_package_dir() is None
    monkeypatch.setenv(compiled_build.CHOICE_ENV, "fast")
    with pytest.raises(ImportError, match="expected auto, python or compiled"):
        compiled_build.compiled_package_dir()


def test_the_allocator_says_which_core_it_runs():
    with AllocatorProcess() as allocator:
        # Logged just after the ready line the process is started on.
        wait_for(lambda: "allocator: core: " in allocator.stderr_tail(10_000), timeout_s=10)
        log = allocator.stderr_tail(10_000)
    # The service's environment has no PAGEDSERVE_* (hermetic_env): it takes a current build.
    compiled = compiled_build.is_current()
    assert ("allocator: core: compiled (mypyc" in log) == compiled, log
    assert ("allocator: core: interpreted (" in log) == (not compiled), log
