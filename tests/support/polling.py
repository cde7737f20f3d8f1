"""Polling until a condition holds, for tests that wait on another process."""
from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def wait_timed(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Polls until `condition` holds; returns the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(0.05)
    return time.monotonic() - started
