"""Keeping the allocator's pools out of Python's cyclic garbage collector.

A pool is tens of thousands of long-lived Block objects. A full collection walks every tracked
object: with a few pools registered, that is a pause of tens of milliseconds, in which no Step is
answered (a fleet benchmark replay showed Step p99 of about 100 ms from it, and 7 ms without).
`gc.freeze()` moves every object alive now into a generation the collector never walks; objects
made later (Steps in flight, sequences, cached token tuples) are collected as usual, and frozen
ones are still freed by reference counting. A dropped pool would be cyclic garbage (its free
list links blocks both ways), so the core unlinks it (FreeBlockQueue.unlink_all) when it drops
it, and nothing of it stays behind.
"""
from __future__ import annotations

import gc


def freeze_long_lived() -> None:
    """Call after a pool was made (or the state was loaded): they are long-lived from now on."""
    gc.freeze()
