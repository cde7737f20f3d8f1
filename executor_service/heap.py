"""How the executor process uses Python's cyclic garbage collector.

The engine's thread is the executor's critical path: while it is paused, no running sequence
gets its next token, and in a fleet the Step that went out with the forward pass has that much
less time to be answered (bench/fleet/). Python's full collection walks every tracked object.
Measured in a simulated executor at 256 running sequences and 5 ms iterations (2026-11-28), it
ran every 0.5-1 s and paused the engine for 60-130 ms: 1.8 s of every 30. So:

1. Once the model is loaded and the engine built, what is alive lives as long as the process
   (torch's modules and ours, the model and its tensors: about 180,000 tracked objects).
   `settle_startup_heap` moves it where no collection looks (`gc.freeze()`); frozen objects are
   still freed by reference counting. That alone took the pauses to 7-15 ms.
2. The engine makes no reference cycles in its steady state: a request and its sequences point
   at each other, and the engine detaches them once it has reported the request's end
   (Request.detach), so reference counting frees them at once. A full collection then finds
   next to nothing, but it still walks every live request's objects each time enough of them
   came and went (every second or so). So automatic full collections are off, and the serving
   loop runs one between iterations once a minute (`FullCollections`): about 10 ms at batch
   256, for the cycles made elsewhere. gRPC's server leaves some at the end of every Session
   stream (about 60 objects: its RPC state, frames, a traceback). The gateway keeps one stream
   per executor, so that is little; a client that opened a stream per request at 100 requests
   a second would leave 6,000 objects a second, which a minute bounds. Within one stream,
   150 requests of every kind (n > 1, beams, best_of, logprobs) left none (2026-11-28).
3. Young collections stay automatic: they walk only what was made since the last one and is
   still alive (about 0.1 ms at 256 running sequences).
"""
from __future__ import annotations

import gc
import time

FULL_EVERY_S = 60.0
# The old generation's threshold: so many collections of the middle generation before a full
# one.
NEVER = 1 << 30


def settle_startup_heap() -> None:
    """Call once the engine is built: freezes what is alive and stops automatic full
    collections (FullCollections runs them)."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)


class FullCollections:
    """A full collection every `every_s`, run by the engine's thread between iterations."""

    def __init__(self, every_s: float = FULL_EVERY_S) -> None:
        self.every_s = every_s
        self.due_at = time.monotonic() + every_s

    def between_iterations(self) -> None:
        if time.monotonic() >= self.due_at:
            gc.collect()
            self.due_at = time.monotonic() + self.every_s
