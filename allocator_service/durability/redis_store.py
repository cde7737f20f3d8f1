"""The durable state store: a journal of commands plus periodic snapshots, in Redis.

    commit(seq N)   MULTI  XADD journal N-0 {kind, body}
                           XADD events  E-0 {...} the KV events of the command, if any
                    EXEC   ← the reply to the caller goes out only after this
    commit_many     the same for commands N..N+k-1 in one MULTI (the Step channel's Steps
                    that arrived together: one round trip for all of them)
    every --snapshot-every commands, from a forked copy of the process (snapshot_writer.py)
                    RPUSH snapshot:next <a piece of the state at seq S>, a piece at a time
                    MULTI  RENAME snapshot:next snapshot; HSET meta snapshot_seq S;
                           XTRIM journal MINID S+1   EXEC
    load            the snapshot's pieces, then replay the journal after it, in order, without
                    gaps

When a commit fails (Redis unreachable) its commands have already changed memory: they are kept
as *pending*, every further change is refused with UNAVAILABLE, and the watchdog calls
`reconcile` once Redis answers again. A transaction lands whole or not at all, so reconcile
compares the stored sequence number with the pending commands' first and last:

    stored == applied          the pending commit landed before the connection broke
    stored == first - 1        it did not: write it now (its callers' retries are then answered
                               from the step record)
    stored <  that             Redis lost acknowledged data (restarted without persistence):
                               write a fresh snapshot of memory and resync the event stream
    stored >  applied          another allocator writes to the same keys: stay down, say so

A Redis restart is also caught when it happens between two commits: every new connection checks
the server's run_id, so a silent reconnect to a restarted server fails the commit instead of
appending after a gap.
"""
from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from allocator_service.core.allocator import Allocator
from allocator_service.core.kv_events import KvEvent, PackedEvents
from allocator_service.durability import commands, redis_codec, snapshot
from allocator_service.durability.commands import Command
from allocator_service.durability.snapshot_writer import (SnapshotTarget, SnapshotWriter,
                                                          add_snapshot)
from allocator_service.durability.state_store import Change, StateStore, StoreUnreachable
from pagedserve.common.config import redacted
from pagedserve.common.errors import Unavailable

log = logging.getLogger(__name__)

# Journal entries read per round trip while replaying.
REPLAY_BATCH = 1000


@dataclass(slots=True, frozen=True)
class _Pending:
    first_seq: int   # the journal number of changes[0]; the rest follow without gaps
    changes: list[Change]

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.changes) - 1


class StoreConflict(RuntimeError):
    """The stored state is ahead of memory: someone else writes to the same keys."""


class RedisStore(StateStore):
    def __init__(self, url: str, namespace: str = redis_codec.DEFAULT_NAMESPACE,
                 snapshot_every: int = 2_000, events_max: int = 100_000,
                 timeout_s: float = 2.0) -> None:
        self.description = redacted(url)
        self.keys = redis_codec.Keys.under(namespace)
        self.snapshot_every = snapshot_every
        self.events_max = events_max
        self.timeout_s = timeout_s
        # No automatic retries: a command that fails must reach us, or a retried MULTI could
        # land in a Redis that restarted without the commits before it.
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), redis_connect_func=self._check_server)
        # The watchdog's pings must reach a restarted server, which `client` refuses until
        # reconcile has looked at it: they go through a connection of their own.
        self._prober = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0))
        self.applied_seq = 0  # last command applied in memory
        self.durable_seq = 0  # last command Redis acknowledged
        self.snapshots = SnapshotWriter(SnapshotTarget(url, self.keys, timeout_s))
        self._snapshot_started_seq = 0  # the command the last snapshot started at
        self.pending: _Pending | None = None
        # The connection commits go through (see _write), taken from the client's pool.
        self._commit_connection: Any = None
        # Ids of the events entries written since the one holding the oldest event kept.
        self._entry_ids: collections.deque[int] = collections.deque()
        self.loaded = False
        self.available = False
        self._down_reason = "state not loaded yet"
        self._down_since = time.monotonic()
        self._server_run_id: bytes | None = None  # None: accept any server (while reconciling)

    # -- connections ---------------------------------------------------------------------------

    def _check_server(self, connection: Any) -> None:
        run_id = redis_codec.connected_run_id(connection)
        # Until reconcile (under the state lock) has looked at the new server, every connection
        # to it is refused, whichever thread makes it.
        if self._server_run_id is not None and run_id != self._server_run_id:
            raise redis.ConnectionError(
                "Redis restarted since the last commit; checking what it kept before writing")

    def _current_run_id(self) -> bytes:
        return str(self.client.info("server")["run_id"]).encode()

    # -- start-up ------------------------------------------------------------------------------

    def load(self, core: Allocator) -> None:
        """Rebuilds the core from the snapshot and the journal after it."""
        try:
            self._load(core)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise StoreUnreachable(str(error)) from error

    def _load(self, core: Allocator) -> None:
        self._server_run_id = None
        snapshot_seq = redis_codec.stored_snapshot_seq(self.client, self.keys)
        if snapshot_seq:
            blob = redis_codec.read_snapshot(self.client, self.keys.snapshot)
            if blob is None:
                raise commands.CorruptJournal(f"{self.keys.meta} names snapshot {snapshot_seq} "
                                              f"but {self.keys.snapshot} is missing")
            snapshot.restore(core, redis_codec.decode_snapshot(blob))
        seq = snapshot_seq
        while True:
            entries = self.client.xrange(self.keys.journal, min=redis_codec.entry_id(seq + 1),
                                         count=REPLAY_BATCH)
            for entry_id, fields in entries:
                if redis_codec.seq_of(entry_id) != seq + 1:
                    raise commands.CorruptJournal(
                        f"journal jumps from {seq} to {entry_id.decode()}: entries are missing")
                commands.apply(core, redis_codec.command_from_fields(fields))
                seq += 1
            core.events.take()  # published when they happened
            if len(entries) < REPLAY_BATCH:
                break
        self.applied_seq = self.durable_seq = seq
        self.snapshots.mark_written(snapshot_seq)
        self._server_run_id = self._current_run_id()
        last_event = self._last_event_seq()
        if last_event > core.events.last_seq:
            raise StoreConflict(f"{self.keys.events} holds event {last_event} but the journal "
                                f"only accounts for {core.events.last_seq}")
        if last_event < core.events.last_seq:  # the stream lost its tail (it is capped too)
            self._reseed(core, f"event stream ends at {last_event}, state at "
                               f"{core.events.last_seq}")
        self.loaded = self.available = True
        self.snapshots.start()
        log.info("state loaded from %s: snapshot at %d, %d journal entries replayed, %d pools",
                 self.description, snapshot_seq, seq - snapshot_seq, len(core.executors))

    # -- commits -------------------------------------------------------------------------------

    def refusal(self) -> str:
        if self.available:
            return ""
        return (f"the allocator's state store {self.description} is unavailable "
                f"({self._down_reason}, {time.monotonic() - self._down_since:.0f}s ago); "
                "changes are refused until it is back, retry later")

    def commit(self, core: Allocator, command: Command, events: PackedEvents) -> None:
        self.commit_many(core, [Change(command, events)])

    def commit_many(self, core: Allocator, changes: list[Change]) -> None:
        assert self.available and self.pending is None, "commit() while refusing"
        first = self.applied_seq + 1
        seq = self.applied_seq = self.applied_seq + len(changes)
        try:
            self._write(first, changes)
        except redis.RedisError as error:
            self.pending = _Pending(first, changes)
            reason = _describe(error)
            what = changes[0].command.kind if len(changes) == 1 else f"{len(changes)} changes"
            self.mark_down(f"the write of {what} #{first} failed: {reason}")
            raise Unavailable(
                f"the allocator's state store {self.description} did not take this change "
                f"({reason}); it is kept and written once the store is back. Retry later: a "
                "Step retried with the same step_id gets its recorded result") from error
        self.durable_seq = seq
        # Counted from the last snapshot started, not the last written: one takes a while. While
        # it is still being made, the next commit asks again.
        if (seq - max(self.snapshots.written_seq, self._snapshot_started_seq)
                >= self.snapshot_every and self.snapshots.offer(core, seq, self._server_run_id)):
            self._snapshot_started_seq = seq

    def _write(self, first_seq: int, changes: list[Change]) -> None:
        """MULTI, per change the journal's XADD and the events' XADD, EXEC: sent as one write
        on a connection kept for commits, the replies read here. redis-py's pipeline does the
        same with more bookkeeping per command than the commands cost (about 60 µs of client
        CPU per commit against 36 µs). Any failure drops the connection, unread replies with
        it; the next commit connects afresh (and checks the server's run_id, as every
        connection does)."""
        transaction: list[tuple[Any, ...]] = [("MULTI",)]
        for seq, change in enumerate(changes, start=first_seq):
            transaction.append(redis_codec.journal_xadd(self.keys, seq, change.command))
            if change.events.count:
                transaction.append(redis_codec.events_xadd(self.keys, change.events,
                                                           self._trim_below(change.events)))
        transaction.append(("EXEC",))
        connection = self._commit_connection
        if connection is None:
            connection = self._commit_connection = self.client.connection_pool.get_connection()
        try:
            connection.send_packed_command(connection.pack_commands(transaction),
                                           check_health=False)
            replies = [connection.read_response() for _ in transaction]
        except BaseException:
            connection.disconnect()
            raise
        executed = replies[-1]
        if executed is None:
            raise redis.ResponseError("the commit's transaction was aborted")
        for reply in executed:
            if isinstance(reply, Exception):
                raise reply

    def _trim_below(self, events: PackedEvents) -> int | None:
        """Where the events stream may be trimmed once the entry of `events` is added: below
        the entry that holds the oldest of the newest --events-max events. An entry's id is
        its first event's number, so that entry is found among the ids this process wrote;
        None (no trim) until it has written that far back."""
        entries = self._entry_ids
        entries.append(events.first_seq)
        oldest_kept = events.last_seq - self.events_max + 1
        while len(entries) > 1 and entries[1] <= oldest_kept:
            entries.popleft()
        return entries[0] if entries[0] <= oldest_kept else None

    # -- outages -------------------------------------------------------------------------------

    def mark_down(self, reason: str) -> None:
        if self.available:
            log.warning("state store %s unavailable: %s", self.description, reason)
            self._down_since = time.monotonic()
        self.available = False
        self._down_reason = reason

    def probe(self) -> bool:
        try:
            return bool(self._prober.ping())
        except redis.RedisError:
            return False

    def reconcile(self, core: Allocator) -> bool:
        """See the module docstring. Raises StoreConflict when memory is behind the store."""
        self._server_run_id = None
        try:
            self._reconcile(core)
        except redis.RedisError as error:
            log.info("state store %s still unavailable: %s", self.description, error)
            return False
        except StoreConflict as conflict:
            if self._down_reason != str(conflict):
                log.error("state store %s: %s", self.description, conflict)
            self.mark_down(str(conflict))
            return False
        return True

    def _reconcile(self, core: Allocator) -> None:
        stored = self._stored_seq()
        if stored > self.applied_seq:
            raise StoreConflict(
                f"{self.description} holds journal entry {stored} but this allocator applied "
                f"only {self.applied_seq}: another allocator writes to the same keys "
                f"({self.keys.journal}); give each its own database or namespace")
        pending = self.pending
        if pending is not None and stored == pending.last_seq:
            # It landed before the connection broke, unless someone else wrote that entry.
            ((_, fields),) = self.client.xrange(self.keys.journal,
                                                min=redis_codec.entry_id(stored),
                                                max=redis_codec.entry_id(stored))
            if redis_codec.command_from_fields(fields) != pending.changes[-1].command:
                raise StoreConflict(
                    f"journal entry {stored} is not the change this allocator made: another "
                    f"allocator writes to the same keys ({self.keys.journal}); give each its "
                    "own database or namespace")
        elif pending is not None and stored == pending.first_seq - 1:
            self._write(pending.first_seq, pending.changes)
        elif stored < self.applied_seq:
            self._reseed(core, f"it holds journal entry {stored}, memory is at "
                               f"{self.applied_seq}")
        self._server_run_id = self._current_run_id()
        self.pending = None
        self.durable_seq = self.applied_seq
        self.available = True
        log.warning("state store %s is back; journal at %d", self.description, self.applied_seq)

    def _reseed(self, core: Allocator, why: str) -> None:
        """Redis lost part of what it acknowledged: store memory whole again, and tell event
        readers to rebuild each pool's index from the entries that follow."""
        log.error("state store %s lost data (%s); writing a fresh snapshot from memory",
                  self.description, why)
        core.announce_every_index()
        pipe = self.client.pipeline(transaction=True)
        add_snapshot(pipe, self.keys, self.applied_seq,
                     redis_codec.encode_snapshot(snapshot.capture(core)))
        events = core.events.take()
        if events.count:
            pipe.execute_command(*redis_codec.events_xadd(self.keys, events,
                                                          self._trim_below(events)))
        pipe.execute()
        self.snapshots.mark_written(self.applied_seq)

    def _stored_seq(self) -> int:
        snapshot_seq = redis_codec.stored_snapshot_seq(self.client, self.keys)
        last = self.client.xrevrange(self.keys.journal, count=1)
        return max(snapshot_seq, redis_codec.seq_of(last[0][0]) if last else 0)

    def _last_event_seq(self) -> int:
        last = self.client.xrevrange(self.keys.events, count=1)
        return redis_codec.entry_last_seq(*last[0]) if last else 0

    # -- events --------------------------------------------------------------------------------

    def read_events(self, from_seq: int, limit: int, wait_s: float) -> list[KvEvent]:
        try:
            return self._read_events(from_seq, limit, wait_s)
        except redis.RedisError as error:
            raise Unavailable(f"cannot read KV events from {self.description}: {error}") from error

    def _read_events(self, from_seq: int, limit: int, wait_s: float) -> list[KvEvent]:
        """Events from `from_seq` on, `limit` entries' worth (a few more events, or fewer)."""
        from_seq = max(1, from_seq)
        # The entry that holds from_seq starts at or before it.
        before = self.client.xrevrange(self.keys.events, max=redis_codec.entry_id(from_seq),
                                       count=1)
        start = (before[0][0] if before and redis_codec.entry_last_seq(*before[0]) >= from_seq
                 else redis_codec.entry_id(from_seq))
        entries = self.client.xrange(self.keys.events, min=start, count=limit)
        # A blocking read must end before the socket timeout, or it reads as an outage.
        wait_s = min(wait_s, self.timeout_s / 2)
        if not entries and wait_s > 0:
            # XREAD returns entries strictly after the id given: after the last one before.
            after = before[0][0] if before else "0-0"
            found = self.client.xread({self.keys.events: after}, count=limit,
                                      block=max(1, int(wait_s * 1000)))
            entries = found[0][1] if found else []
        return [event for entry_id, fields in entries
                for event in redis_codec.events_from_entry(entry_id, fields)
                if event.seq >= from_seq]

    def close(self) -> None:
        self.snapshots.close()
        if self._commit_connection is not None:
            self._commit_connection.disconnect()
        self.client.close()
        self._prober.close()


def _describe(error: redis.RedisError) -> str:
    """The error without the command redis-py quotes in it (a Step's raw request bytes)."""
    text = str(error)
    marker = "of pipeline caused error: "
    return text.split(marker, 1)[1] if marker in text else text
