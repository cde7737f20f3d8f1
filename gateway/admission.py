"""Bounded admission: at most `max_running` requests generate at once and at most `max_queued`
wait for a turn; a request beyond both is refused at once (RESOURCE_EXHAUSTED) instead of
joining an unbounded queue. Waiters are served first come, first served.

    with admission.slot(cancelled):   # may wait; raises ResourceExhausted when full
        ... generate ...
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pagedserve.common.errors import ResourceExhausted, Unavailable

POLL_S = 0.1


class Admission:
    def __init__(self, max_running: int, max_queued: int) -> None:
        self.max_running, self.max_queued = max_running, max_queued
        self.running = 0
        self._waiting: deque[object] = deque()
        self._changed = threading.Condition()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @contextmanager
    def slot(self, cancelled: Callable[[], bool] = lambda: False) -> Iterator[None]:
        self._acquire(cancelled)
        try:
            yield
        finally:
            with self._changed:
                self.running -= 1
                self._changed.notify_all()

    def _acquire(self, cancelled: Callable[[], bool]) -> None:
        with self._changed:
            if self.running < self.max_running and not self._waiting:
                self.running += 1
                return
            if len(self._waiting) >= self.max_queued:
                raise ResourceExhausted(
                    f"the gateway is at capacity: {self.running} requests running and "
                    f"{len(self._waiting)} queued (limits {self.max_running} and "
                    f"{self.max_queued}); retry later")
            ticket = object()
            self._waiting.append(ticket)
            try:
                while not (self._waiting[0] is ticket and self.running < self.max_running):
                    if cancelled():
                        raise Unavailable("the request was cancelled while it queued")
                    self._changed.wait(POLL_S)
                self.running += 1
            finally:
                self._waiting.remove(ticket)
                self._changed.notify_all()
