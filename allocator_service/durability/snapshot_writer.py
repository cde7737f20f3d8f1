"""Snapshots written by a forked copy of the allocator, so that no Step waits for one.

A snapshot is the whole core. For one pool of 16,384 blocks, capturing it takes about 50 ms
and encoding it about 100 ms. For a fleet it takes seconds: 32 pools of 24,576 blocks need
3.6 s to capture and 3 s to encode. The capture ran inside the Step that asked for it, under
the state lock. The encode ran on a thread that held the GIL nearly throughout. Either way,
every Step behind it waited.

`fork()` copies only the process's page tables, about 20 ms per GiB resident, and the kernel
shares the pages copy-on-write. So the child sees the core exactly as it stood at the commit
that asked for the snapshot. The child captures, encodes and writes the snapshot on a core of
its own, then exits. The parent goes back to serving once fork returns. A thread waits for
the child and records the outcome.

What the child may touch: fork keeps only the thread that called it, and other threads' locks
stay as they were at that moment. So the child uses nothing the parent shares with its
threads. It opens its own Redis connection, logs nothing, and leaves with `os._exit`, which
runs no finalizer. A finalizer could shut down a socket the child shares with the parent.

The child's write is guarded twice:
- It writes only to the Redis server the parent committed to, checked by run_id. A restarted,
  emptied Redis must be reseeded by the parent (redis_store.py), not handed an older
  snapshot.
- It writes only if no newer snapshot is stored (WATCH on the meta key). A reseed may have
  written one while the child was capturing.

Without `fork` (Windows), the Step captures the snapshot under the lock and a thread encodes and
writes it, as before.
"""
from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from allocator_service.core.allocator import Allocator
from allocator_service.durability import redis_codec, snapshot

log = logging.getLogger(__name__)

CAN_FORK = hasattr(os, "fork")
# Exit statuses of a snapshot child.
WRITTEN, SUPERSEDED, FAILED = 0, 3, 4
# The longest error text a child reports back.
MAX_REPORT_BYTES = 4096


def add_snapshot(pipe: Any, keys: redis_codec.Keys, seq: int, blob: bytes) -> None:
    """The writes of a snapshot at `seq`, queued on a transaction: the snapshot, its number, and
    the journal trimmed to the entries after it. All in one command's worth of Redis's time: for
    the rare snapshot a reseed writes under the state lock; a child writes piece by piece
    (write_if_newer)."""
    pipe.delete(keys.snapshot)
    pipe.rpush(keys.snapshot, *redis_codec.snapshot_pieces(blob))
    _number_snapshot(pipe, keys, seq)


def _number_snapshot(pipe: Any, keys: redis_codec.Keys, seq: int) -> None:
    """Queues, behind the writes that put the snapshot at `seq` in place, its number and the
    journal trimmed to the entries after it."""
    pipe.hset(keys.meta, mapping={"snapshot_seq": seq, "format": snapshot.FORMAT_VERSION})
    pipe.xtrim(keys.journal, minid=redis_codec.entry_id(seq + 1), approximate=False)


def write_if_newer(client: redis.Redis, keys: redis_codec.Keys, seq: int, blob: bytes) -> bool:
    """Writes the snapshot unless one at `seq` or later is stored; False when it is.

    The blob goes to a list of its own, a piece of at most SNAPSHOT_PIECE bytes per RPUSH, and
    one transaction then renames it into place with its number and trims the journal. Redis
    writes each command into its append-only file from its one thread, before it answers anyone
    else: a fleet's snapshot (tens of MB) written as one SET held that thread for 115 ms
    (Redis's `LATENCY LATEST`: aof-write, 22 executors at 20 ms), and every commit with it.
    Not APPENDs to one string: past a few MB each APPEND copied the string so far (10-27 ms
    apiece in Redis's slow log); a list element is written where it is."""
    if redis_codec.stored_snapshot_seq(client, keys) >= seq:
        return False
    client.delete(keys.snapshot_next)
    for piece in redis_codec.snapshot_pieces(blob):
        client.rpush(keys.snapshot_next, piece)
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(keys.meta)
        if redis_codec.stored_snapshot_seq(pipe, keys) < seq:
            pipe.multi()
            pipe.rename(keys.snapshot_next, keys.snapshot)
            _number_snapshot(pipe, keys, seq)
            try:
                pipe.execute()
                return True
            except redis.WatchError:  # a newer snapshot landed meanwhile
                pass
    client.delete(keys.snapshot_next)
    return False


@dataclass(frozen=True, slots=True)
class SnapshotTarget:
    """Where snapshots go: the store's Redis, under its namespace."""
    url: str
    keys: redis_codec.Keys
    timeout_s: float


@dataclass(slots=True)
class _Child:
    pid: int
    seq: int
    report: int  # read end of the pipe the child writes its error to
    started: float
    # How long fork() held the Step that asked for the snapshot.
    fork_s: float


class SnapshotWriter:
    """Makes one snapshot at a time, and after each rests as long as it took.

    The rest bounds what snapshots cost to about half of a core, whatever the interval. A
    fleet's state takes seconds to capture and encode, and at the default --snapshot-every a
    fleet's commands would otherwise start the next snapshot as soon as one ends."""

    def __init__(self, target: SnapshotTarget,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self._clock = clock
        # The last snapshot known to be stored, and whether one is being made now.
        self.written_seq = 0
        self._busy = False
        # No snapshot starts before this moment (on `clock`): the rest after the last one.
        self._resting_until = float("-inf")
        self._lock = threading.Lock()
        # A child to wait for, or (without fork) captured data to write; None stops the thread.
        self._work: queue.Queue[_Child | tuple[int, Any, bytes | None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether a snapshot is being made now."""
        return self._busy

    def offer(self, core: Allocator, seq: int, server_run_id: bytes | None) -> bool:
        """Starts a snapshot of the core at journal entry `seq`, already durable; call under
        the state lock. False when one is still being made or the writer rests after the last
        one: nothing starts, ask again later. True when this one was tried: it runs, or fork
        failed (logged), and the next waits for the next interval rather than forking on every
        commit."""
        with self._lock:
            if self._busy or self._clock() < self._resting_until:
                return False
            self._busy = True
        if not CAN_FORK:
            self._work.put((seq, snapshot.capture(core), server_run_id))
            return True
        started = self._clock()
        try:
            report, report_w = os.pipe()
            try:
                with warnings.catch_warnings():
                    # Python 3.12 warns about fork in a threaded process; the child touches
                    # nothing another thread could hold (module docstring).
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:
                os.close(report)
                os.close(report_w)
                raise
        except OSError as error:
            # Out of memory or processes: the Step goes on; the next interval tries again.
            log.warning("snapshot at %d not started: fork failed: %s", seq, error)
            with self._lock:
                self._busy = False
            return True
        if pid == 0:
            os.close(report)
            _child(self.target, core, seq, server_run_id, report_w)
        os.close(report_w)
        self._work.put(_Child(pid, seq, report, started, self._clock() - started))
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Waits for a snapshot being written (up to `timeout_s`), then stops the thread."""
        if self._thread.is_alive():
            self._work.put(None)
            self._thread.join(timeout_s)

    def mark_written(self, seq: int) -> None:
        """A snapshot at `seq` was stored by other means (a reseed)."""
        with self._lock:
            self.written_seq = max(self.written_seq, seq)

    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            if isinstance(work, _Child):
                seq, started = work.seq, work.started
                how = f"by a child process forked in {1000 * work.fork_s:.1f} ms"
                written, error = _wait(work)
            else:
                started = self._clock()
                seq, data, run_id = work
                how = "by a thread"
                written, error = _write_in_thread(self.target, seq, data, run_id)
            ended = self._clock()
            if error:
                log.warning("snapshot at %d not written: %s", seq, error)
            elif written:
                log.info("snapshot at %d written in %.0f ms, %s", seq, 1000 * (ended - started),
                         how)
            with self._lock:
                self._busy = False
                self._resting_until = ended + (ended - started)
                if written:
                    self.written_seq = max(self.written_seq, seq)


def _wait(child: _Child) -> tuple[bool, str]:
    """(written, error text) once the child has exited."""
    chunks = []
    while chunk := os.read(child.report, MAX_REPORT_BYTES):
        chunks.append(chunk)
    os.close(child.report)
    _, status = os.waitpid(child.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == WRITTEN:
        return True, ""
    if code == SUPERSEDED:
        return False, ""
    text = b"".join(chunks).decode(errors="replace").strip()
    return False, text or f"the snapshot process ended with status {code}"


def _child(target: SnapshotTarget, core: Allocator, seq: int, server_run_id: bytes | None,
           report: int) -> NoReturn:
    """The forked child: capture, encode, write, exit. Never returns into the parent's code."""
    status = FAILED
    try:
        gc.disable()  # a process that lives for one snapshot gains nothing from collections
        written = _encode_and_write(target, seq, snapshot.capture(core), server_run_id)
        status = WRITTEN if written else SUPERSEDED
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which logs it
        os.write(report, f"{type(error).__name__}: {error}".encode()[:MAX_REPORT_BYTES])
    finally:
        os._exit(status)


def _write_in_thread(target: SnapshotTarget, seq: int, data: Any,
                     server_run_id: bytes | None) -> tuple[bool, str]:
    try:
        return _encode_and_write(target, seq, data, server_run_id), ""
    except redis.RedisError as error:
        return False, str(error)


def _encode_and_write(target: SnapshotTarget, seq: int, data: Any,
                      server_run_id: bytes | None) -> bool:
    """Encodes captured data and writes it unless a newer snapshot is stored (write_if_newer),
    on a connection of its own to the server with this run_id."""
    client = _client(target, server_run_id)
    try:
        return write_if_newer(client, target.keys, seq, redis_codec.encode_snapshot(data))
    finally:
        client.close()


def _client(target: SnapshotTarget, server_run_id: bytes | None) -> redis.Redis:
    """A client of its own that only ever talks to the server with this run_id (any, if None)."""
    def check_server(connection: Any) -> None:
        run_id = redis_codec.connected_run_id(connection)
        if server_run_id is not None and run_id != server_run_id:
            raise redis.ConnectionError("Redis restarted since the snapshot was asked for; "
                                        "the allocator reseeds it instead")
    return redis.Redis.from_url(target.url, socket_timeout=target.timeout_s,
                                socket_connect_timeout=target.timeout_s,
                                retry=Retry(NoBackoff(), 0), redis_connect_func=check_server)
