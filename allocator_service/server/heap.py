"""How the allocator process uses Python's cyclic garbage collector.

A full collection walks every tracked object. Until 2026-11-28 a pool was tens of thousands of
long-lived Block objects: with a few pools registered, that was a pause of tens of milliseconds,
in which no Step is answered (a fleet benchmark replay showed Step p99 of about 100 ms from it,
and 7 ms without). A pool's blocks are arrays now, but its sequences, recorded results and
executors are still objects, long-lived and many. `gc.freeze()` moves every object alive now into a generation the collector never walks; objects
made later (Steps in flight, sequences, recorded results) are collected as usual, and frozen
ones are still freed by reference counting. A pool holds no reference cycles (its blocks are
records in flat arrays, linked by id: core/block.py), so a dropped pool is freed whole at once.

What is left for the collector is what Steps make: ops and results, freed by reference counting
within the Step, and what outlives a Step for seconds: sequences, each executor's recent Step
results (kept for retries) and the KV events kept for readers. Python starts a young collection
when allocations minus deallocations pass a threshold. In a busy allocator the two balance: every
new sequence, result and event replaces one that is freed. So the count hardly moves while the
young generation fills with everything made since the last collection and still alive. In a
fleet replay (64 executors at 20 ms, 2026-11-26) young collections came every 6 s and walked
400,000 objects each, 140-160 ms in which no Step was answered; Step p99 was 27 ms.

So the process runs the collector on a clock instead (`CollectionSchedule`): every 50 ms it
collects the two younger generations together, which walks what was made in those 50 ms and is
still alive (1-3 ms at 64 executors) and moves it to the old generation. What stays for
seconds is kept where the collector does not look at all: recorded results and kept KV events
are bytes (core/allocator.py, durability/state_store.py). The old generation, whose walk
is the long pause, is collected once every 10 minutes: the Step path makes no reference cycles
(those collections find nothing to free), so this is a safety net, not a need. The same replay
had Step p99 3.7 ms with this schedule.
"""
from __future__ import annotations

import gc
import threading
import time

# The young generations' collection: what was made in this long (and is still alive) is walked
# once. Shorter means shorter pauses and more of them; 50 ms keeps each to a few milliseconds
# at a hundred executors.
YOUNG_EVERY_S = 0.05
# The full collection: its pause grows with the live sequences, and the Step path makes no
# cycles for it to find.
FULL_EVERY_S = 600.0


class CollectionSchedule:
    """Collects on a clock from a thread of its own; automatic collection is off meanwhile."""

    def __init__(self, young_every_s: float = YOUNG_EVERY_S,
                 full_every_s: float = FULL_EVERY_S) -> None:
        self.young_every_s = young_every_s
        self.full_every_s = full_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._was_enabled = gc.isenabled()

    def start(self) -> CollectionSchedule:
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._was_enabled:
            gc.enable()

    def _run(self) -> None:
        last_full = time.monotonic()
        while not self._stop.wait(self.young_every_s):
            if time.monotonic() - last_full >= self.full_every_s:
                gc.collect()
                last_full = time.monotonic()
            else:
                gc.collect(1)

    def __enter__(self) -> CollectionSchedule:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def freeze_long_lived() -> None:
    """Call after a pool was made (or the state was loaded): they are long-lived from now on."""
    gc.freeze()
