"""The one door to the allocator core: its lock, its state store, and the store's watchdog.

    with state.reading() as core:        any RPC that only looks (and Heartbeat)
    with state.writing() as core:        any RPC that changes state; inside, after the change:
        ...; state.commit(command)           journal it (with its KV events) before replying

    with state.writing() as core:        several changes journaled together (a group commit):
        ...; changes.append(state.change(command))   after each
        state.commit_many(changes)           once, before any of their replies goes out

Writes are refused with UNAVAILABLE while the store cannot take them, so memory is never more
than one (uncommitted, unacknowledged) commit ahead of the store.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from allocator_service.core.allocator import Allocator
from allocator_service.durability import commands
from allocator_service.durability.commands import Command
from allocator_service.durability.state_store import Change, StateStore
from pagedserve.common.errors import Unavailable

log = logging.getLogger(__name__)


class AllocatorState:
    def __init__(self, core: Allocator, store: StateStore,
                 on_availability: Callable[[bool], None] = lambda available: None) -> None:
        self.core = core
        self.store = store
        self.lock = threading.Lock()
        # Told when the store goes away or comes back (health turns NOT_SERVING / SERVING).
        self.on_availability = on_availability

    @contextmanager
    def reading(self) -> Iterator[Allocator]:
        with self.lock:
            if not self.store.loaded:
                raise Unavailable(self.store.refusal())
            yield self.core

    @contextmanager
    def writing(self) -> Iterator[Allocator]:
        with self.lock:
            refusal = self.store.refusal()
            if refusal:
                raise Unavailable(refusal)
            try:
                yield self.core
            finally:
                self.drop_stray_events()

    def drop_stray_events(self) -> None:
        """A change that raised halfway must not leave its events for the next commit."""
        if self.core.events.num_pending:
            log.error("a change raised after emitting %d KV events; they are dropped",
                      self.core.events.num_pending)
            self.core.events.take()

    def commit(self, command: Command) -> None:
        """Journals the change just made (call inside `writing()`)."""
        assert self.lock.locked()
        self.store.commit(self.core, command, self.core.events.take())

    def change(self, command: Command) -> Change:
        """The change just made with the events it caused, to commit with others."""
        return Change(command, self.core.events.take())

    def commit_many(self, changes: list[Change]) -> None:
        """Journals the changes made since the last commit, in order, all or none (call
        inside `writing()`)."""
        assert self.lock.locked()
        self.store.commit_many(self.core, changes)

    def reclaim_expired(self) -> list[str]:
        """Reclaims pools whose lease lapsed, durably; nothing while the store is away."""
        try:
            with self.writing() as core:
                expired = core.expired_leases()
                if not expired:
                    return []
                dropped = core.reclaim(expired)
                self.commit(commands.reclaim(expired))
                return dropped
        except Unavailable:
            return []

    # -- the store's watchdog ------------------------------------------------------------------

    def watch_store(self, stop: threading.Event, interval_s: float = 0.5) -> None:
        """Probes the store; when it stops answering, refuses writes, and when it answers
        again, reconciles it with memory and accepts writes again."""
        was_available = self.store.available
        while not stop.wait(interval_s):
            answering = self.store.probe()
            with self.lock:
                if not answering and self.store.available:
                    self.store.mark_down("it does not answer")
                elif answering and not self.store.available:
                    self._reconcile()
                available = self.store.available
            if available != was_available:
                self.on_availability(available)
                was_available = available

    def _reconcile(self) -> None:
        try:
            self.store.reconcile(self.core)
        except Exception:  # noqa: BLE001 - stay down and say why; never write over it blindly
            log.exception("state store cannot be reconciled; changes stay refused")
