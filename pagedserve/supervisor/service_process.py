"""The services as the tests and benchmarks run them: started by the constructor on a free
loopback port, ready (SERVING) when it returns, stopped by `stop()` or `with`.

    with AllocatorProcess("--auth-token", "t") as allocator:
        stub = AllocatorStub(allocator.channel(token="t"))

Each is a `SupervisedProcess` (supervised.py), the supervisor `pagedserve up` uses too: it
starts `python -m MODULE --host 127.0.0.1 --port 0 ...`, reads the bound address from the
ready line, waits for gRPC health SERVING, and always stops the process (SIGTERM, then
SIGKILL).
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from pagedserve.supervisor.supervised import ServiceStartError, SupervisedProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PREFIX = "allocator listening on "

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


class ServiceProcess(SupervisedProcess):
    """One pagedserve service as a subprocess (`python -m MODULE --port 0 ...`); started by the
    constructor, stopped by `stop()` or `with`. Subclasses name the module and its ready line."""

    MODULE = "allocator_service"
    READY_PREFIX = READY_PREFIX
    HTTP_PREFIX = ""

    def __init__(self, *extra_args: str, startup_timeout_s: float = 30.0,
                 env: dict[str, str] | None = None, stderr_lines: int = 500,
                 wait_serving: bool = True, tls_ca: str = "") -> None:
        """`wait_serving=False` returns once the service listens, SERVING or not. `tls_ca`:
        the service serves TLS (pass its --tls-cert and --tls-key); our channels verify it."""
        self.args = [sys.executable, "-m", self.MODULE, "--host", "127.0.0.1",
                     "--port", "0", *extra_args]
        super().__init__(" ".join(self.args[2:]), self.args, ready_prefix=self.READY_PREFIX,
                         http_prefix=self.HTTP_PREFIX, env=hermetic_env(env), cwd=REPO_ROOT,
                         startup_timeout_s=startup_timeout_s, wait_serving=wait_serving,
                         tls_ca=tls_ca, log_lines=stderr_lines)
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 10.0) -> int:  # type: ignore[override]
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; returns the exit code. Idempotent."""
        code = super().stop(timeout_s)
        assert code is not None
        return code


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


class AllocatorTarget(Protocol):
    """What pagedctl needs to reach an allocator, or an allocator group."""

    @property
    def target(self) -> str:
        """HOST:PORT, or HOST:PORT,HOST:PORT,... for a group."""

    @property
    def tls_ca(self) -> str:
        """The CA that verifies its TLS; empty for plaintext."""


def pagedctl_audit(allocator: AllocatorTarget, token: str = ""
                   ) -> subprocess.CompletedProcess[str]:
    """`pagedctl audit` against this allocator (or group), as an operator runs it."""
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
