"""Bounded admission: at most `max_running` requests generate at once and at most `max_queued`
wait for a turn; a request beyond both is refused at once (RESOURCE_EXHAUSTED) instead of
joining an unbounded queue. Waiters are served first come, first served.

    async with admission.slot():   # may wait; raises ResourceExhausted when full
        ... generate ...

It lives on the gateway's event loop, like every request, so it needs no lock. A waiter whose
client goes away is cancelled (its task is) and simply leaves the queue.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pagedserve.common.errors import ResourceExhausted


class Admission:
    def __init__(self, max_running: int, max_queued: int) -> None:
        self.max_running, self.max_queued = max_running, max_queued
        self.running = 0
        # One future per waiter, set when a running request hands its slot on.
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self.running < self.max_running and not self._waiting:
            self.running += 1
            return
        if len(self._waiting) >= self.max_queued:
            raise ResourceExhausted(
                f"the gateway is at capacity: {self.running} requests running and "
                f"{len(self._waiting)} queued (limits {self.max_running} and "
                f"{self.max_queued}); retry later")
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()          # handed a slot just as the client went away
            elif turn in self._waiting:
                self._waiting.remove(turn)
            raise

    def _release(self) -> None:
        """Frees a slot: the first waiter takes it over (counted as running already)."""
        self.running -= 1
        while self._waiting and self.running < self.max_running:
            turn = self._waiting.popleft()
            if turn.cancelled():         # its waiter is leaving; its except clause runs later
                continue
            self.running += 1
            turn.set_result(None)
