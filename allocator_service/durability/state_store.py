"""Where the allocator's changes go: the interface, and the in-memory store (the default).

Every change to the core is committed to the store before its reply goes out, together with
the KV events it caused. The in-memory store keeps nothing but a ring of recent events (so
`pagedctl events` works without Redis); `RedisStore` makes the state durable.
"""
from __future__ import annotations

import bisect
import collections
import threading
from dataclasses import dataclass

from allocator_service.core.allocator import Allocator
from allocator_service.core.kv_events import KvEvent, PackedEvents, records, unpack_record
from allocator_service.durability.commands import Command


@dataclass(slots=True, frozen=True)
class Change:
    """One applied command and the KV events it caused, as a store journals them."""
    command: Command
    events: PackedEvents


class StoreUnreachable(Exception):
    """The backing store does not answer; retrying later may succeed."""


class StateStore:
    """The contract the allocator's state gate relies on; every method runs under its lock,
    except `read_events` and `probe`."""

    description = "memory"
    # False until the stored state is in the core (every call is refused until then).
    loaded = True
    # False while the store cannot take commits (changes are refused until it can again).
    available = True
    # Commands journaled so far (the in-memory store journals nothing).
    applied_seq = 0
    # Whether Steps that arrive together should wait for one commit (commit_many) before any of
    # them is answered: worth it when a commit costs a round trip, as Redis' does. A store that
    # commits in this process says False, and each Step is answered as soon as it applied.
    groups_commits = True

    def load(self, core: Allocator) -> None:
        """Fills an empty core with the stored state (nothing to load in memory). Raises
        StoreUnreachable while the store does not answer; anything else is fatal."""

    def commit(self, core: Allocator, command: Command, events: PackedEvents) -> None:
        """Makes one applied command durable, with its events, before its reply goes out.
        Raises Unavailable when it cannot; the store then refuses commits until `reconcile`."""
        raise NotImplementedError

    def commit_many(self, core: Allocator, changes: list[Change]) -> None:
        """Makes several applied commands durable, in order, all or none (a group commit:
        the Step channel's Steps that arrived together). Raises as `commit`."""
        for change in changes:
            self.commit(core, change.command, change.events)

    def refusal(self) -> str:
        """Why commits are refused right now ('' when they are not)."""
        return ""

    def probe(self) -> bool:
        """Whether the backing store answers (called by the watchdog, without the lock)."""
        return True

    def mark_down(self, reason: str) -> None:
        """Refuses commits from now on, saying why."""

    def reconcile(self, core: Allocator) -> bool:
        """Brings the store back in line with the core after an outage; False while it is
        still unreachable."""
        return True

    def read_events(self, from_seq: int, limit: int, wait_s: float) -> list[KvEvent]:
        """Up to `limit` events with seq >= from_seq, waiting up to wait_s for the first one."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases connections and threads."""


class MemoryStore(StateStore):
    """No durability: state lives and dies with the process. Keeps the last events for readers."""

    # A commit here is a few microseconds in this process: nothing to share among Steps.
    groups_commits = False

    def __init__(self, max_events: int = 100_000) -> None:
        self.max_events = max_events
        # One entry per commit, oldest first: its events as the core packed them (one bytes
        # object, kv_events.py), unpacked only for a reader. Not tuples: a hundred thousand kept
        # tuples would each be walked by the cyclic collector before it learns to skip them,
        # several per cent of a busy allocator's CPU.
        self._batches: collections.deque[PackedEvents] = collections.deque()
        # Events at the front of the oldest batch that are already out of the ring.
        self._dropped = 0
        self._num_events = 0
        self._last_seq = 0
        self._new_events = threading.Condition()
        # Readers blocked in read_events: a commit wakes them only when there are any (a
        # Condition's notify_all is several Python calls even with nobody to wake).
        self._waiting = 0

    def commit(self, core: Allocator, command: Command, events: PackedEvents) -> None:
        if events.count:
            with self._new_events:
                self._batches.append(events)
                self._num_events += events.count
                self._last_seq = events.last_seq
                self._drop_oldest()
                if self._waiting:
                    self._new_events.notify_all()

    def _drop_oldest(self) -> None:
        while self._num_events > self.max_events:
            excess = self._num_events - self.max_events
            oldest_left = self._batches[0].count - self._dropped
            if excess >= oldest_left:
                self._batches.popleft()
                self._dropped = 0
                self._num_events -= oldest_left
            else:
                self._dropped += excess
                self._num_events -= excess

    def read_events(self, from_seq: int, limit: int, wait_s: float) -> list[KvEvent]:
        with self._new_events:
            if wait_s > 0 and (not self._batches or self._last_seq < from_seq):
                self._waiting += 1
                try:
                    self._new_events.wait(wait_s)
                finally:
                    self._waiting -= 1
            if limit <= 0 or not self._batches or self._last_seq < from_seq:
                return []
            # Numbers can skip (a change that raised drops its events), so search, not subtract:
            # from the last batch starting at or before from_seq.
            first = max(0, bisect.bisect_right(self._batches, from_seq,
                                               key=lambda batch: batch.first_seq) - 1)
            found: list[KvEvent] = []
            for index in range(first, len(self._batches)):
                packed = records(self._batches[index])
                for event in packed[self._dropped:] if index == 0 else packed:
                    if event[0] >= from_seq:
                        found.append(unpack_record(event))
                        if len(found) == limit:
                            return found
            return found
