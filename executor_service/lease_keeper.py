"""Keeps the executor's lease while the engine is busy computing.

The engine renews its lease with every Step, and with a heartbeat when idle: both come from the
engine's one thread, between iterations. An iteration longer than the lease (a cold start, a
long prefill on a busy CPU) would let the allocator reclaim a live executor's pool, and every
running request would be recomputed on a new one. This thread renews the lease whenever the
engine has not called the allocator for a third of it, so only a dead (or frozen) process
loses its pool.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LeaseKeeper:
    def __init__(self, renew: Callable[[], None], lease_ttl_s: Callable[[], float]) -> None:
        """`renew` sends a heartbeat (and handles its errors); `lease_ttl_s` reads the lease's
        length, which each registration may change."""
        self._renew, self._lease_ttl_s = renew, lease_ttl_s
        self._last_call = time.monotonic()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def called(self) -> None:
        """The engine just called the allocator, which renewed the lease."""
        self._last_call = time.monotonic()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        while not self._closed.wait(self._lease_ttl_s() / 6):
            if time.monotonic() - self._last_call >= self._lease_ttl_s() / 3:
                self._renew()
                self.called()
