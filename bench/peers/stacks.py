"""The two contenders as servers on free loopback ports, each with its OpenAI HTTP API at
`base_url`, started and waited for until they answer, stopped however the benchmark ends.

- pagedserve: what `pagedserve up --model DIR` starts (allocator, one executor, gateway, with
  `up`'s command lines and its supervisor), through bench/serve/stack.py's Stack; the executor
  gets the peer's settings: block size, KV cache, sequences, the served model name.
- vLLM: `vllm serve DIR` from the peer's venv (install.py), in a session of its own (it starts
  an engine-core child), with `VLLM_CPU_KVCACHE_SPACE` (GiB) and `VLLM_CPU_OMP_THREADS_BIND`;
  ready once GET /v1/models answers 200. Its log goes to a file (the model compile is chatty),
  whose tail is shown when it fails. Stopped with SIGTERM to its process group, SIGKILL to the
  group after a grace period.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.peers.install import peer_env, vllm_command
from bench.serve.stack import Stack
from pagedserve.supervisor.supervised import PARENT_WATCH

HOST = "127.0.0.1"
PAGEDSERVE, VLLM = "pagedserve", "vllm"
CONTENDERS = (PAGEDSERVE, VLLM)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What both servers are given alike."""
    model_dir: Path
    served_name: str
    block_size: int = 32
    kv_cache_gib: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    dtype: str = "float32"
    startup_timeout_s: float = 600.0


def pagedserve_executor_flags(s: ServerSettings) -> list[str]:
    return ["--model", str(s.model_dir), "--served-model-name", s.served_name,
            "--dtype", s.dtype, "--block-size", str(s.block_size),
            "--kv-cache-memory", f"{s.kv_cache_gib}G", "--max-num-seqs", str(s.max_num_seqs),
            "--max-num-batched-tokens", str(s.max_num_batched_tokens)]


def vllm_flags(s: ServerSettings, port: int) -> list[str]:
    return [str(s.model_dir), "--host", HOST, "--port", str(port),
            "--served-model-name", s.served_name, "--dtype", s.dtype,
            "--block-size", str(s.block_size), "--max-num-seqs", str(s.max_num_seqs),
            "--max-num-batched-tokens", str(s.max_num_batched_tokens)]


def vllm_env(s: ServerSettings) -> dict[str, str]:
    env = peer_env()
    env.update(VLLM_CPU_KVCACHE_SPACE=str(s.kv_cache_gib), PYTHONUNBUFFERED="1",
               VLLM_CPU_OMP_THREADS_BIND=env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"))
    return env


class PagedserveServer(Stack):
    """`pagedserve up --model DIR` with the shared settings; `base_url` is its gateway's HTTP."""

    name = PAGEDSERVE

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(pagedserve_executor_flags(settings),
                         executor_startup_timeout_s=settings.startup_timeout_s)

    @property
    def base_url(self) -> str:
        return self.http_url


class VllmServer:
    """`with VllmServer(settings, venv, log) as server:` vLLM serves at `server.base_url`."""

    name = VLLM

    def __init__(self, settings: ServerSettings, venv: Path, log_path: Path) -> None:
        self.settings, self.venv, self.log_path = settings, venv, log_path
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [str(vllm_command(self.venv)), "serve", *vllm_flags(self.settings, self.port)]

    def __enter__(self) -> VllmServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.command)}\n".encode())
            log.flush()
            # PARENT_WATCH: SIGTERM if the benchmark dies, then exec of `vllm` (same pid).
            self.process = subprocess.Popen(
                [sys.executable, "-c", PARENT_WATCH, str(os.getpid()), *self.command],
                env=vllm_env(self.settings), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.process.returncode}) before it "
                                   f"answered; last lines of {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not answer within "
                                   f"{self.settings.startup_timeout_s:.0f} s; last lines of "
                                   f"{self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/v1/models", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)

    def stop(self, timeout_s: float = 60.0) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        # The engine core (a child in the same group) may outlive the API server.
        signal_group(process.pid, signal.SIGKILL)
        process.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid


def signal_group(pgid: int, signum: int) -> None:
    """Signals the process group this module started (its leader's pid is the group id)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]
