"""One service of `pagedserve up`, run as a supervised child process: started, its output echoed
with its name, waited for (gRPC health SERVING), stopped politely then firmly. Its log tail is
kept so a service that dies can be reported with its last words."""
from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from pagedserve.common.client import is_serving, open_channel
from pagedserve.common.processes import stop_gracefully

# The line every service prints once it listens ("<name> listening on HOST:PORT"), and the
# gateway's second line for its HTTP port.
LISTENING = " listening on "
HTTP_API = " HTTP API on "


class ServiceFailed(RuntimeError):
    """A child exited or never became ready; the message ends with its log tail."""


@dataclass
class ChildService:
    name: str
    argv: list[str]
    startup_timeout_s: float = 120.0
    process: subprocess.Popen[str] | None = None
    log_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=40))
    # What the child printed: its gRPC HOST:PORT (and the gateway's HTTP URL).
    address: str = ""
    http_url: str = ""
    # Whether its output is printed (prefixed with its name); the tail is kept either way.
    echo: bool = True

    def start(self, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, bufsize=1,
                                        env=env)
        self._pump_thread = threading.Thread(target=self._pump, name=f"{self.name}-log",
                                             daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip()
            self.log_tail.append(line)
            if LISTENING in line and not self.address:
                self.address = line.rsplit(" ", 1)[-1]
            elif HTTP_API in line and not self.http_url:
                self.http_url = line.rsplit(" ", 1)[-1]
            if self.echo:
                # One write per line: print() writes the text and the newline separately, and
                # the children's pumps run at once, so two lines could run together.
                sys.stdout.write(f"[{self.name}] {line}\n")
                sys.stdout.flush()

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def wait_ready(self) -> None:
        """Until the child reports SERVING; ServiceFailed if it exits or takes too long."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.exited:
                raise self.failure(f"exited with code {self.process.returncode}")
            if self.address and self._serving():
                return
            time.sleep(0.1)
        raise self.failure(f"was not ready after {self.startup_timeout_s:.0f}s")

    def _serving(self) -> bool:
        with open_channel(self.address) as channel:   # health needs no token
            return is_serving(channel)

    def failure(self, what: str) -> ServiceFailed:
        if self.exited:
            self._pump_thread.join(timeout=5)   # a dead child's last lines are the useful ones
        return ServiceFailed(f"{self.name} {what}; last lines of its log:\n"
                             + "\n".join(self.log_tail))

    def request_stop(self) -> None:
        """SIGTERM without waiting: the service starts its graceful shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.process is None:
            return None
        return stop_gracefully(self.process, timeout_s)
