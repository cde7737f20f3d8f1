"""Keeping the allocator's pools out of Python's cyclic garbage collector.

A pool is tens of thousands of long-lived Block objects. A full collection walks every tracked
object: with a few pools registered, that is a pause of tens of milliseconds, in which no Step is
answered (a fleet benchmark replay showed Step p99 of about 100 ms from it, and 7 ms without).
`gc.freeze()` moves every object alive now into a generation the collector never walks; objects
made later (Steps in flight, sequences, recorded results) are collected as usual, and frozen
ones are still freed by reference counting. A dropped pool would be cyclic garbage (its free
list links blocks both ways), so the core unlinks it (FreeBlockQueue.unlink_all) when it drops
it, and nothing of it stays behind.

What is left for the collector is what a Step makes and drops: ops, results, events, nearly
all freed by reference counting before any collection could find them. Python's default (a
young collection per 700 net allocations) runs several per Step; a young collection per 10,000
walks each survivor about as often but moves far fewer into the older generations, whose
collections walk them again. In fleet replays (32 executors, 2026-11-25) it cost the same CPU
or less, and Step p99 fell from 10-20 ms to 2-3 ms. One young collection then takes about 2 ms.
"""
from __future__ import annotations

import gc

# (young, middle, old): a young collection per 10,000 net allocations of tracked objects, a
# middle one per 20 young ones, an old one per 100 middle ones (and only when a quarter of the
# long-lived objects are new, as always).
COLLECTION_THRESHOLDS = (10_000, 20, 100)


def collect_less_often() -> None:
    """Call once at start: the allocator makes little cyclic garbage."""
    gc.set_threshold(*COLLECTION_THRESHOLDS)


def freeze_long_lived() -> None:
    """Call after a pool was made (or the state was loaded): they are long-lived from now on."""
    gc.freeze()
