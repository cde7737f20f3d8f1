"""The one supervisor of a pagedserve service process, used by `pagedserve up`, the tests and
the benchmarks: start it, read its ready lines (its gRPC HOST:PORT and, for the gateway, its
HTTP URL), wait for gRPC health SERVING, stop it politely then firmly.

    service = SupervisedProcess("allocator", [sys.executable, "-m", "allocator_service", ...])
    service.start()
    service.wait_ready()          # ServiceStartError with its log tail if it exits or hangs
    ...
    service.stop()                # SIGTERM, SIGKILL after a grace period

stdout and stderr are drained by background threads, so a chatty service never blocks on a
full pipe; every line goes into a log tail for failure messages, and with `echo` is printed
prefixed with the service's name (one write per line, so the lines of several services never
run together). With `own_session` the service runs in a session of its own, out of the
terminal's process group: a Ctrl-C reaches only the supervisor, which then stops its services
in the order it chooses. Such a child also gets SIGTERM when the supervisor dies (Linux), so
it is not left running behind a supervisor killed with -9.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import grpc

from pagedserve.common.client import is_serving, open_channel

# Runs in the child, then becomes the service (exec keeps the pid): on Linux it asks for
# SIGTERM when the supervisor dies, and exits at once if the supervisor already has.
PARENT_WATCH = (
    "import ctypes, os, signal, sys\n"
    "parent = int(sys.argv[1])\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != parent:\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n")


class ServiceStartError(RuntimeError):
    """The service exited, or did not become ready in time; the message ends with its log."""


def stop_gracefully(process: subprocess.Popen, timeout_s: float) -> int:  # type: ignore[type-arg]
    """SIGTERM (a service drains and shuts down in order), SIGKILL after `timeout_s`; returns the
    exit code. A process that already exited is only reaped."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


class SupervisedProcess:
    """One service process. `ready_prefix`: the line it prints once it listens, followed by its
    HOST:PORT; `http_prefix`, if given, a second line followed by its HTTP URL."""

    def __init__(self, name: str, argv: Sequence[str], *, ready_prefix: str,
                 http_prefix: str = "", env: dict[str, str] | None = None,
                 cwd: str | Path | None = None, echo: bool = False, own_session: bool = False,
                 startup_timeout_s: float = 120.0, wait_serving: bool = True,
                 tls_ca: str = "", log_lines: int = 500) -> None:
        self.name, self.argv = name, list(argv)
        self.ready_prefix, self.http_prefix = ready_prefix, http_prefix
        self.env, self.cwd = env, cwd
        self.echo, self.own_session = echo, own_session
        self.startup_timeout_s, self.wait_serving = startup_timeout_s, wait_serving
        self.tls_ca = tls_ca
        self.process: subprocess.Popen[str] | None = None
        # What the service printed: its gRPC HOST:PORT and the gateway's HTTP URL.
        self.address = ""
        self.http_url = ""
        self._log: collections.deque[str] = collections.deque(maxlen=log_lines)
        self._stderr: collections.deque[str] = collections.deque(maxlen=log_lines)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._open_streams = 0
        self._readers: list[threading.Thread] = []
        self._channels: list[grpc.Channel] = []

    # -- start-up ------------------------------------------------------------------------------

    def start(self, env: dict[str, str] | None = None) -> None:
        argv = self.argv
        if self.own_session:
            argv = [sys.executable, "-c", PARENT_WATCH, str(os.getpid()), *argv]
        self.process = subprocess.Popen(
            argv, cwd=self.cwd, env=env if env is not None else self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            bufsize=1, start_new_session=self.own_session)
        assert self.process.stdout is not None and self.process.stderr is not None
        self._open_streams = 2
        self._readers = [threading.Thread(target=self._pump, args=(stream, is_stderr),
                                          name=f"{self.name}-{kind}", daemon=True)
                         for stream, is_stderr, kind in ((self.process.stdout, False, "stdout"),
                                                         (self.process.stderr, True, "stderr"))]
        for reader in self._readers:
            reader.start()

    def _pump(self, stream: IO[str], is_stderr: bool) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            with self._changed:
                self._log.append(line)
                if is_stderr:
                    self._stderr.append(raw)
                if not self.address and line.startswith(self.ready_prefix):
                    self.address = line[len(self.ready_prefix):].strip()
                elif (self.http_prefix and not self.http_url
                      and line.startswith(self.http_prefix)):
                    self.http_url = line[len(self.http_prefix):].strip()
                self._changed.notify_all()
            if self.echo:
                # One write per line: print() writes the text and the newline separately, and
                # the services' pumps run at once, so two lines could run together.
                sys.stdout.write(f"[{self.name}] {line}\n")
                sys.stdout.flush()
        with self._changed:
            self._open_streams -= 1
            self._changed.notify_all()

    def wait_ready(self) -> None:
        """Until the service printed its ready lines and, with `wait_serving`, reports SERVING;
        ServiceStartError (with the log tail) if it exits or takes longer than the timeout."""
        timeout_s = self.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        problem = ""
        with self._changed:   # (the failure is raised outside: it takes the lock itself)
            while not (self.address and (self.http_url or not self.http_prefix)):
                if self._open_streams == 0:
                    problem = "exited before it printed its address"
                    break
                if not self._changed.wait(timeout=max(0.0, deadline - time.monotonic())) \
                        and time.monotonic() >= deadline:
                    problem = f"printed no address within {timeout_s:.0f}s"
                    break
        if problem:
            raise self.failure(problem)
        if not self.wait_serving:
            return
        deadline = time.monotonic() + timeout_s
        with open_channel(self.address, tls_ca=self.tls_ca) as channel:   # health needs no token
            while not is_serving(channel):
                if self.exited:
                    raise self.failure("exited before it reported SERVING")
                if time.monotonic() > deadline:
                    raise self.failure(f"was not SERVING within {timeout_s:.0f}s")
                time.sleep(0.05)

    def failure(self, what: str) -> ServiceStartError:
        """The error to raise about this service: what happened, its exit code, its log tail."""
        if self.process is not None and (self._open_streams == 0 or self.exited):
            try:        # an exiting service's last lines are the useful ones
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
            else:
                for reader in self._readers:
                    reader.join(timeout=2.0)
        code = self.process.poll() if self.process is not None else None
        return ServiceStartError(f"{self.name} {what} (exit code {code}); last lines of its "
                                 f"log:\n{self.log_tail()}")

    # -- use -----------------------------------------------------------------------------------

    @property
    def target(self) -> str:
        return self.address

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def channel(self, token: str = "") -> grpc.Channel:
        """A new channel to the service, closed by `stop()`."""
        channel = open_channel(self.address, token, self.tls_ca)
        self._channels.append(channel)
        return channel

    def log_tail(self, lines: int = 50) -> str:
        """The last lines of its stdout and stderr, as they came."""
        with self._lock:
            return "\n".join(list(self._log)[-lines:])

    def stderr_tail(self, lines: int = 50) -> str:
        with self._lock:
            return "".join(list(self._stderr)[-lines:])

    # -- shutdown ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """SIGTERM without waiting: the service starts its graceful shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; returns the exit code. Idempotent."""
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self.process is None:
            return None
        stop_gracefully(self.process, timeout_s)
        for reader in self._readers:
            reader.join(timeout=2.0)
        return self.process.returncode

    def __enter__(self):  # noqa: ANN204 - the subclass's own type
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
