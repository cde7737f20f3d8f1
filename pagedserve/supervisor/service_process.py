"""Runs the real allocator as a subprocess on a loopback port, for integration tests and benches.

    with AllocatorProcess("--auth-token", "t") as allocator:
        stub = AllocatorStub(allocator.channel(token="t"))

It starts `python -m allocator_service --port 0`, reads the bound port from the one stdout line,
waits for grpc health SERVING, and always stops the process (SIGTERM, then SIGKILL). stdout and
stderr are drained by background threads, so a chatty server never blocks on a full pipe.
"""
from __future__ import annotations

import collections
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import grpc

from pagedserve.common.client import is_serving, open_channel
from pagedserve.common.processes import stop_gracefully

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PREFIX = "allocator listening on "


class ServiceStartError(RuntimeError):
    """The service exited, or did not become ready in time; the message ends with its log."""


AllocatorStartError = ServiceStartError


def hermetic_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment minus PAGEDSERVE_* (a stray token or port must not leak into a test)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PAGEDSERVE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def alive(pid: int) -> bool:
    """Whether a process with this id exists (a benchmark's services must be gone after it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class ServiceProcess:
    """One pagedserve service as a subprocess (`python -m MODULE --port 0 ...`); started by the
    constructor, stopped by `stop()` or `with`. Subclasses name the module and its ready line."""

    MODULE = "allocator_service"
    READY_PREFIX = READY_PREFIX

    def __init__(self, *extra_args: str, startup_timeout_s: float = 30.0,
                 env: dict[str, str] | None = None, stderr_lines: int = 500,
                 wait_serving: bool = True, tls_ca: str = "") -> None:
        """`wait_serving=False` returns once the service listens, SERVING or not. `tls_ca`:
        the service serves TLS (pass its --tls-cert and --tls-key); our channels verify it."""
        self.tls_ca = tls_ca
        self.args = [sys.executable, "-m", self.MODULE, "--host", "127.0.0.1",
                     "--port", "0", *extra_args]
        self._stderr: collections.deque[str] = collections.deque(maxlen=stderr_lines)
        self._stdout: queue.Queue[str | None] = queue.Queue()
        self._channels: list[grpc.Channel] = []
        self.process = subprocess.Popen(
            self.args, cwd=REPO_ROOT, env=hermetic_env(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        assert self.process.stdout is not None and self.process.stderr is not None
        self._stderr_lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._drain_stdout, args=(self.process.stdout,),
                             name=f"{self.MODULE}-stdout", daemon=True),
            threading.Thread(target=self._drain_stderr, args=(self.process.stderr,),
                             name=f"{self.MODULE}-stderr", daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        try:
            self.target = self._read_target(startup_timeout_s)
            self.port = int(self.target.rsplit(":", 1)[1])
            if wait_serving:
                self._wait_serving(startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    # -- start-up ------------------------------------------------------------------------------

    def _drain_stdout(self, stream: IO[str]) -> None:
        for line in stream:
            self._stdout.put(line)
        self._stdout.put(None)  # EOF: the process closed stdout (it exited)

    def _drain_stderr(self, stream: IO[str]) -> None:
        for line in stream:
            with self._stderr_lock:
                self._stderr.append(line)

    def _read_target(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._stdout.get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise self._start_error(f"printed no ready line within {timeout_s:.0f}s") from None
            if line is None:
                raise self._start_error("exited before printing its ready line", exited=True)
            if line.startswith(self.READY_PREFIX):
                return line[len(self.READY_PREFIX):].strip()

    def _wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        channel = self.channel()
        while True:
            if is_serving(channel):
                return
            if self.process.poll() is not None:
                raise self._start_error("exited before reporting SERVING", exited=True)
            if time.monotonic() > deadline:
                raise self._start_error(f"was not SERVING within {timeout_s:.0f}s")
            time.sleep(0.05)

    def _start_error(self, what: str, exited: bool = False) -> ServiceStartError:
        if exited:  # reap it and let the last lines of its log arrive
            try:
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
            self._readers[1].join(timeout=2.0)
        return ServiceStartError(
            f"{' '.join(self.args[2:])} {what} (exit code {self.process.poll()}); "
            f"stderr tail:\n{self.stderr_tail()}")

    # -- use -----------------------------------------------------------------------------------

    def channel(self, token: str = "") -> grpc.Channel:
        """A new channel to the service, closed by `stop()`."""
        channel = open_channel(self.target, token, self.tls_ca)
        self._channels.append(channel)
        return channel

    def stderr_tail(self, lines: int = 50) -> str:
        with self._stderr_lock:
            return "".join(list(self._stderr)[-lines:])

    @property
    def pid(self) -> int:
        return self.process.pid

    # -- shutdown ------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; returns the exit code. Idempotent."""
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        stop_gracefully(self.process, timeout_s)
        for reader in self._readers:
            reader.join(timeout=2.0)
        return self.process.returncode

    def __enter__(self):  # noqa: ANN204 - the subclass's own type
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class AllocatorProcess(ServiceProcess):
    """`python -m allocator_service`."""



class ExecutorProcess(ServiceProcess):
    """`python -m executor_service`: SERVING once its model is loaded and its pool registered
    (pass --allocator HOST:PORT). The embedded default model is cached under the test's own
    PAGEDSERVE_CACHE_DIR when the caller gives one in `env`."""

    MODULE = "executor_service"
    READY_PREFIX = "executor listening on "

    def __init__(self, *extra_args: str, startup_timeout_s: float = 90.0,
                 env: dict[str, str] | None = None, stderr_lines: int = 500,
                 tls_ca: str = "") -> None:
        super().__init__(*extra_args, startup_timeout_s=startup_timeout_s, env=env,
                         stderr_lines=stderr_lines, tls_ca=tls_ca)


class GatewayProcess(ServiceProcess):
    """`python -m gateway`: SERVING once it reached at least one ready executor through the
    allocator (pass --allocator HOST:PORT). Its HTTP API listens on a free port too, at
    `http_url` (e.g. http://127.0.0.1:PORT)."""

    MODULE = "gateway"
    READY_PREFIX = "gateway listening on "
    HTTP_PREFIX = "gateway HTTP API on "

    def __init__(self, *extra_args: str, startup_timeout_s: float = 30.0,
                 env: dict[str, str] | None = None, stderr_lines: int = 500,
                 wait_serving: bool = True, tls_ca: str = "") -> None:
        if "--http-port" not in extra_args:
            extra_args = (*extra_args, "--http-port", "0")
        super().__init__(*extra_args, startup_timeout_s=startup_timeout_s, env=env,
                         stderr_lines=stderr_lines, wait_serving=wait_serving, tls_ca=tls_ca)
        try:
            self.http_url = self._read_line(self.HTTP_PREFIX, startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _read_line(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._stdout.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise self._start_error(f"exited before printing {prefix!r}", exited=True)
            if line.startswith(prefix):
                return line[len(prefix):].strip()


def pagedctl_audit(allocator: AllocatorProcess, token: str = ""
                   ) -> subprocess.CompletedProcess[str]:
    """`pagedctl audit` against this allocator, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "pagedserve.cli.pagedctl", "--target",
                           allocator.target, "--token", token, "--tls-ca", allocator.tls_ca,
                           "audit"], capture_output=True,
                          text=True,
                          timeout=60, env=hermetic_env())


@contextmanager
def gateway_stack(cache: Path | None = None, *executor_args: str, num_blocks: int = 256,
                  gateway_args: tuple[str, ...] = ()
                  ) -> Iterator[tuple[AllocatorProcess, GatewayProcess]]:
    """The smallest whole stack: an allocator, one executor (the embedded default, cached under
    `cache`, unless `executor_args` name a --model) and a gateway that looks for executors every
    0.2 s. Stopped in reverse order on exit."""
    env = {"PAGEDSERVE_CACHE_DIR": str(cache)} if cache else None
    with AllocatorProcess() as allocator, \
            ExecutorProcess("--allocator", allocator.target, "--num-blocks", str(num_blocks),
                            *executor_args, env=env), \
            GatewayProcess("--allocator", allocator.target, "--refresh-s", "0.2",
                           *gateway_args) as gateway:
        yield allocator, gateway
