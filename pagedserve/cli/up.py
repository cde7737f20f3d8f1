"""`pagedserve up`: start the stack's services as supervised child processes on loopback.

Today the stack is the allocator alone (executors and the gateway come with their own issues).
Each child is started, waited for (health SERVING), and stopped in reverse order on Ctrl-C or
SIGTERM. A child that dies at start makes `up` exit non-zero with the tail of its log.
"""
from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pagedserve.cli import pagedctl
from pagedserve.common.client import is_serving, open_channel
from pagedserve.common.processes import stop_gracefully

STARTUP_TIMEOUT_S = 60.0


@dataclass
class ChildService:
    name: str
    argv: list[str]
    process: subprocess.Popen[str] | None = None
    log_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=40))
    address: str = ""

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        """Echoes the child's output with its name and remembers the tail for failures."""
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.log_tail.append(line.rstrip())
            if " listening on " in line and not self.address:
                self.address = line.rsplit(" ", 1)[-1].strip()
            print(f"[{self.name}] {line.rstrip()}", flush=True)

    def wait_ready(self, token: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(self._failure(f"exited with code {self.process.returncode}"))
            if self.address and self._serving(token):
                return
            time.sleep(0.1)
        raise RuntimeError(self._failure(f"was not ready after {STARTUP_TIMEOUT_S:.0f}s"))

    def _serving(self, token: str) -> bool:
        with open_channel(self.address, token) as channel:
            return is_serving(channel)

    def _failure(self, what: str) -> str:
        if self.process is not None and self.process.poll() is not None:
            self._pump_thread.join(timeout=5)  # a dead child's last lines are the useful ones
        return f"{self.name} {what}; last lines of its log:\n" + "\n".join(self.log_tail)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is not None:
            stop_gracefully(self.process, timeout_s)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve up", description=__doc__.split("\n\n")[0])
    parser.add_argument("--allocator-port", type=int, default=50052,
                        help="allocator port (0 picks a free one)")
    parser.add_argument("--auth-token", default="", help="bearer token for every service")
    parser.add_argument("--state-url", default="",
                        help="redis://HOST:PORT/DB: the allocator's durable state (default: "
                             "in memory)")
    parser.add_argument("--exit-when-ready", action="store_true",
                        help="stop everything once the stack is up (for smoke tests)")
    return parser


def up(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    auth = ["--auth-token", args.auth_token] if args.auth_token else []
    state = ["--state-url", args.state_url] if args.state_url else []
    children = [ChildService("allocator", [sys.executable, "-m", "allocator_service",
                                           "--port", str(args.allocator_port), *auth, *state])]
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: stop_requested.set())
    try:
        for child in children:
            child.start()
            child.wait_ready(args.auth_token)
        allocator = children[0].address
        print(f"\npagedserve is up:\n  allocator  {allocator}   "
              f"(pagedctl --target {allocator} stats)\n", flush=True)
        pagedctl.main(["--target", allocator, "--token", args.auth_token, "stats"])
        if not args.exit_when_ready:
            print("\nserving; Ctrl-C stops everything", flush=True)
        while not args.exit_when_ready and not stop_requested.wait(0.5):
            for child in children:
                if child.process is not None and child.process.poll() is not None:
                    raise RuntimeError(child._failure(
                        f"exited unexpectedly with code {child.process.returncode}"))
        return 0
    except RuntimeError as error:
        print(f"pagedserve up: {error}", file=sys.stderr)
        return 1
    finally:
        for child in reversed(children):
            child.stop()
