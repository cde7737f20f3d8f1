"""Stopping a child process the way every pagedserve supervisor does: politely, then firmly."""
from __future__ import annotations

import signal
import subprocess


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
