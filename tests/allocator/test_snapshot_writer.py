"""Snapshots written by a forked child (allocator_service/durability/snapshot_writer.py), against
a real redis-server: what the child writes is the core as it stood when the snapshot was asked
for, an older snapshot never replaces a newer one, and a child never writes to a Redis that
restarted since. The kill -9 tests (test_allocator_crash_recovery.py) restore from snapshots
written this way by a real allocator process."""
from __future__ import annotations

import logging
import threading
import time

import pytest

from allocator_service.core.allocator import Allocator
from allocator_service.durability import redis_codec, snapshot
from allocator_service.durability.redis_codec import SNAPSHOT_PIECE, read_snapshot
from allocator_service.durability.snapshot_writer import (CAN_FORK, SnapshotTarget, SnapshotWriter,
                                                          write_if_newer)
from bench.durability.recovery import SNAPSHOT_LINE as DURABILITY_SNAPSHOT_LINE
from bench.fleet.capacity import Snapshots
from pagedserve.protocol.block_ops import AllocateOp, AppendOp
from tests.support.allocator_core import A10, BLOCK_SIZE, NUM_BLOCKS, step

pytestmark = pytest.mark.skipif(not CAN_FORK, reason="snapshots are forked only where fork exists")

KEYS = redis_codec.Keys.under("snapshot-writer-test")


def busy_core() -> Allocator:
    core = Allocator()
    core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    step(core, "e", AllocateOp("a", tuple(A10)), AppendOp("a", num_computed_tokens=10))
    return core


def stored(client) -> tuple[int, dict | None]:
    blob = read_snapshot(client, KEYS.snapshot)
    return (redis_codec.stored_snapshot_seq(client, KEYS),
            None if blob is None else redis_codec.decode_snapshot(blob))


def wait_idle(writer: SnapshotWriter, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while writer.busy:
        assert time.monotonic() < deadline, "the snapshot child did not finish"
        time.sleep(0.01)


@pytest.fixture
def writer(redis_server):
    writer = SnapshotWriter(SnapshotTarget(redis_server.url, KEYS, timeout_s=5.0))
    writer.start()
    yield writer
    writer.close()


def run_id(client) -> bytes:
    return str(client.info("server")["run_id"]).encode()


def test_child_writes_the_core_as_it_was_when_asked_and_trims_the_journal(redis_server, writer,
                                                                         caplog):
    caplog.set_level(logging.INFO, logger="allocator_service.durability.snapshot_writer")
    client = redis_server.client()
    for seq in range(1, 8):
        client.execute_command(*redis_codec.journal_xadd(
            KEYS, seq, redis_codec.command_from_fields({b"kind": b"step", b"body": b"x"})))
    core = busy_core()
    expected = snapshot.capture(core)
    assert writer.offer(core, 5, run_id(client))
    # The parent changes its core at once; the child's copy is the one from the fork.
    step(core, "e", AllocateOp("b", (7, 7, 7)))
    wait_idle(writer)

    seq, data = stored(client)
    assert (seq, data) == (5, expected)
    assert writer.written_seq == 5
    assert [redis_codec.seq_of(entry_id) for entry_id, _ in client.xrange(KEYS.journal)] == [6, 7]
    # The benchmarks read the snapshot's times from this line.
    (line,) = [r.getMessage() for r in caplog.records if "snapshot at 5" in r.getMessage()]
    snapshots = Snapshots(every=5)
    snapshots.read_log(line)
    assert len(snapshots.fork_ms) == len(snapshots.written_ms) == 1
    assert DURABILITY_SNAPSHOT_LINE.search(line)


def test_a_second_offer_while_a_child_runs_starts_nothing(redis_server, writer):
    client = redis_server.client()
    core = busy_core()
    assert writer.offer(core, 3, run_id(client))
    started_again = writer.offer(core, 4, run_id(client))
    wait_idle(writer)
    # A fast child may be done before the second offer; then the second one ran too.
    assert stored(client)[0] == (4 if started_again else 3)


def test_older_snapshot_never_replaces_a_newer_one(redis_server, writer, caplog):
    client = redis_server.client()
    assert write_if_newer(client, KEYS, 9, redis_codec.encode_snapshot({"newer": True}))
    caplog.set_level(logging.INFO, logger="allocator_service.durability.snapshot_writer")
    assert writer.offer(busy_core(), 6, run_id(client))
    wait_idle(writer)
    assert stored(client) == (9, {"newer": True})
    assert writer.written_seq == 0
    assert not [r for r in caplog.records if "snapshot at 6" in r.getMessage()]


def test_a_large_snapshot_reaches_redis_in_pieces_then_renamed_into_place(redis_server):
    """A snapshot of several pieces: Redis sees an RPUSH per piece (each one write into its
    append-only file), then the rename; it reads back whole, and a snapshot that lost to a
    newer one leaves nothing behind. One stored as a string (before 2026-11-28) still reads."""
    client = redis_server.client()
    blob = bytes(range(256)) * (SNAPSHOT_PIECE * 5 // 2 // 256)   # two and a half pieces
    client.config_resetstat()
    assert write_if_newer(client, KEYS, 7, blob)
    stats = client.info("commandstats")
    assert stats["cmdstat_rpush"]["calls"] == 3 and stats["cmdstat_rename"]["calls"] == 1
    assert "cmdstat_set" not in stats and "cmdstat_append" not in stats
    assert client.llen(KEYS.snapshot) == 3 and read_snapshot(client, KEYS.snapshot) == blob
    assert int(client.hget(KEYS.meta, "snapshot_seq")) == 7
    assert not client.exists(KEYS.snapshot_next)

    assert not write_if_newer(client, KEYS, 5, b"older")   # refused before writing a piece
    assert read_snapshot(client, KEYS.snapshot) == blob
    assert not client.exists(KEYS.snapshot_next)
    client.set(KEYS.snapshot, b"one string")
    assert read_snapshot(client, KEYS.snapshot) == b"one string"


def test_child_refuses_a_redis_that_restarted_since(redis_server, writer, caplog):
    client = redis_server.client()
    caplog.set_level(logging.WARNING, logger="allocator_service.durability.snapshot_writer")
    assert writer.offer(busy_core(), 4, b"0" * 40)  # not this server's run_id
    wait_idle(writer)
    assert stored(client) == (0, None)
    assert writer.written_seq == 0
    (record,) = [r for r in caplog.records if "snapshot at 4 not written" in r.getMessage()]
    assert "Redis restarted since the snapshot was asked for" in record.getMessage()


def test_a_failed_fork_is_logged_and_the_next_interval_tries_again(redis_server, writer, caplog,
                                                                   monkeypatch):
    client = redis_server.client()

    def no_memory() -> int:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr("allocator_service.durability.snapshot_writer.os.fork", no_memory)
    caplog.set_level(logging.WARNING, logger="allocator_service.durability.snapshot_writer")
    assert writer.offer(busy_core(), 4, run_id(client))  # tried: the interval starts over
    assert not writer.busy
    assert "snapshot at 4 not started: fork failed" in caplog.text
    monkeypatch.undo()
    assert writer.offer(busy_core(), 8, run_id(client))
    wait_idle(writer)
    assert stored(client)[0] == 8


class HeldClock:
    """A clock the test sets; the writer thread's reading (when a snapshot ends) waits until the
    test lets it, so the snapshot's duration is the one the test chose."""

    def __init__(self) -> None:
        self.now = 0.0
        self.release = threading.Event()

    def __call__(self) -> float:
        if threading.current_thread().name == "snapshot-writer":
            assert self.release.wait(30), "the test never let the snapshot end"
        return self.now


def test_after_a_snapshot_the_writer_rests_as_long_as_it_took(redis_server):
    clock = HeldClock()
    writer = SnapshotWriter(SnapshotTarget(redis_server.url, KEYS, timeout_s=5.0), clock=clock)
    writer.start()
    try:
        client, core = redis_server.client(), busy_core()
        assert writer.offer(core, 3, run_id(client))  # starts at 0
        clock.now = 4.0  # and ends at 4: it took 4 s
        clock.release.set()
        wait_idle(writer)
        assert stored(client)[0] == 3
        clock.now = 7.9
        assert not writer.offer(core, 6, run_id(client))  # resting until 8
        assert not writer.busy
        clock.now = 8.0
        assert writer.offer(core, 6, run_id(client))
        wait_idle(writer)
        assert stored(client)[0] == 6
    finally:
        writer.close()
