"""The allocator process's collector schedule (server/heap.py): young generations on a clock,
the old one rarely, automatic collection off meanwhile."""
from __future__ import annotations

import gc
import time
import weakref

from allocator_service.server.heap import CollectionSchedule


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref]:
    """Two nodes that refer to each other: only the cyclic collector frees them."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


def freed_within(ref: weakref.ref, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.005)
    return ref() is None


def test_automatic_collection_is_off_while_it_runs_and_back_after():
    assert gc.isenabled()
    with CollectionSchedule(young_every_s=0.01):
        assert not gc.isenabled()
    assert gc.isenabled()


def test_young_garbage_cycles_are_freed_on_the_clock():
    with CollectionSchedule(young_every_s=0.01, full_every_s=3600):
        node, ref = cycle()
        del node
        assert freed_within(ref, 2.0)


def test_a_cycle_that_grew_old_waits_for_the_full_collection():
    # A cycle alive at a collection of the younger generations moves to the old one; only a full
    # collection walks it there.
    for full_every_s, expect_freed in ((3600, False), (0.1, True)):
        with CollectionSchedule(young_every_s=0.01, full_every_s=full_every_s):
            node, ref = cycle()
            gc.collect(1)  # what the schedule does while the cycle is still in use
            del node
            assert freed_within(ref, 0.5) is expect_freed
        gc.collect()
