"""Recovery after a crash: how long a durable allocator killed with SIGKILL takes to serve again,
by length of the journal it must replay, and what a snapshot costs and saves.

All of it on one redis-server of its own (appendfsync everysec). One allocator journals the
serving mix with snapshots off; at each point it is killed and restarted on the same data, then
takes its next step on the same pool (same epoch, step ids go on). The time to SERVING runs from
spawning the process to its own `serving` log line, so it includes interpreter start-up and
imports; the memory allocator's start-up is the baseline.
"""
from __future__ import annotations

import datetime
import re
import time
import zlib
from pathlib import Path

from tqdm import tqdm

from allocator_service.core.allocator import Allocator
from allocator_service.core.inspection import pool_stats
from allocator_service.durability import redis_codec, snapshot
from allocator_service.durability.redis_store import RedisStore
from bench.durability.config import LEASE_TTL, NO_SNAPSHOTS, TARGET_BATCH, Sizes
from bench.durability.report import RecoveryPoint, Results
from bench.load.allocator_rpc import StepClient
from bench.load.allocator_workload import ServingMix
from pagedserve.supervisor.redis_server import RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess

# The allocator's own log lines that mark its start-up (see allocator_service/__main__.py).
LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
SERVING_LINE = re.compile(LOG_TIME + r"allocator INFO \[-\] allocator: serving$", re.M)
SNAPSHOT_LINE = re.compile(r"snapshot at (\d+) written in (\d+) ms")
KEYS = redis_codec.Keys.under(redis_codec.DEFAULT_NAMESPACE)


def start_timed(*args: str) -> tuple[AllocatorProcess, float]:
    """Starts an allocator; returns it and the seconds from spawn to its "serving" log line."""
    spawned = time.time()
    allocator = AllocatorProcess(*args)
    deadline = time.monotonic() + 5.0
    while not (match := SERVING_LINE.search(allocator.stderr_tail(500))):
        if time.monotonic() > deadline:  # logging changed: fall back to the client's view
            return allocator, time.time() - spawned
        time.sleep(0.01)
    served = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return allocator, served - spawned


def kill(allocator: AllocatorProcess) -> None:
    """SIGKILL, like a crash: no shutdown hook runs."""
    allocator.process.kill()
    allocator.process.wait()
    allocator.stop()


def load_in_process(url: str) -> tuple[float, Allocator]:
    """RedisStore.load of what the restarted allocator loaded, timed without process start-up."""
    core = Allocator(lease_ttl_s=float(LEASE_TTL))
    store = RedisStore(url)
    try:
        start = time.perf_counter()
        store.load(core)
        return time.perf_counter() - start, core
    finally:
        store.close()


class CrashLoop:
    """One durable allocator on `redis_server`, its client, and the serving mix it is fed."""

    def __init__(self, sizes: Sizes, redis_server: RedisProcess, results: Results) -> None:
        self.sizes, self.redis_server, self.results = sizes, redis_server, results
        self.store_client = redis_server.client()
        self.base = ("--lease-ttl", LEASE_TTL, "--state-url", redis_server.url)
        self.journal_only = (*self.base, "--snapshot-every", str(NO_SNAPSHOTS))
        self.allocator, _ = start_timed(*self.journal_only)
        try:
            self.client = StepClient(self.allocator.channel(), "mix", sizes.num_blocks,
                                     sizes.block_size)
        except BaseException:
            self.allocator.stop()
            raise
        self.mix = ServingMix(seed=2, max_running=TARGET_BATCH)

    def run(self, steps: int, desc: str) -> None:
        for _ in tqdm(range(steps), desc=desc, unit="step", leave=False):
            request = self.client.request(self.mix.next_step())
            start = time.perf_counter()
            self.client.send(request)
            self.results.recovery_step_s.append(time.perf_counter() - start)

    def measure(self, label: str) -> Allocator:
        """Kills and restarts the allocator `restarts` times on the journal as it stands, loads
        the same data in-process, then steps on; returns the in-process core."""
        journal_bytes = self.store_client.memory_usage(KEYS.journal, samples=0) or 0
        point = RecoveryPoint(label, self.store_client.xlen(KEYS.journal), journal_bytes)
        for _ in tqdm(range(self.sizes.restarts), desc=f"kill -9 + restart: {label}",
                      leave=False):
            kill(self.allocator)
            self.allocator, serving_s = start_timed(*self.journal_only)
            point.serving_s.append(serving_s)
        point.load_s, core = load_in_process(self.redis_server.url)
        self.results.recovery.append(point)
        # The restarted allocator serves the same pool: same epoch, step ids go on.
        self.client.reconnect(self.allocator.channel())
        self.run(1, "step after restart")
        return core

    def take_snapshot(self) -> None:
        """The first commit of an allocator started with a --snapshot-every below the journal's
        length forks a child (in the Step, under the lock) that captures and writes the state."""
        kill(self.allocator)
        self.allocator, _ = start_timed(*self.base, "--snapshot-every",
                                        str(self.sizes.journal_steps[0]))
        self.client.reconnect(self.allocator.channel())
        start = time.perf_counter()
        self.client.step(self.mix.next_step())
        self.results.snapshot_step_s = time.perf_counter() - start
        deadline = time.monotonic() + 120
        while (self.store_client.xlen(KEYS.journal) > 0
               or not self.store_client.exists(KEYS.snapshot)):
            if time.monotonic() > deadline:
                raise RuntimeError("the snapshot was not written within 120 s:\n"
                                   + self.allocator.stderr_tail())
            time.sleep(0.05)
        time.sleep(0.2)  # its log line follows the write
        if written := SNAPSHOT_LINE.search(self.allocator.stderr_tail(500)):
            self.results.snapshot_written_ms = float(written.group(2))
        blob = redis_codec.read_snapshot(self.store_client, KEYS.snapshot) or b""
        self.results.snapshot_bytes = len(blob)
        self.results.snapshot_json_bytes = len(zlib.decompress(blob))


def time_snapshot_parts(core: Allocator, results: Results) -> None:
    """Capture and encode of the recovered state, timed alone in this process: what the
    snapshot's child process does before it writes."""
    start = time.perf_counter()
    data = snapshot.capture(core)
    results.snapshot_capture_s = time.perf_counter() - start
    start = time.perf_counter()
    redis_codec.encode_snapshot(data)
    results.snapshot_encode_s = time.perf_counter() - start
    stats = pool_stats("mix", core.executors["mix"].pool)
    results.pool_state = (
        f"{stats.num_blocks:,} blocks × {stats.block_size}: {stats.num_used_blocks:,} "
        f"in use by {stats.num_sequences} sequences, {stats.num_cached_free_blocks:,} "
        "free holding prefix-cache entries")


def start_baseline(restarts: int) -> list[float]:
    """Spawn to SERVING of the memory allocator: what every restart pays before any replay."""
    samples = []
    for _ in tqdm(range(restarts), desc="start-up baseline (memory)", leave=False):
        allocator, serving_s = start_timed("--lease-ttl", LEASE_TTL)
        allocator.stop()
        samples.append(serving_s)
    return samples


def bench_recovery(sizes: Sizes, data_dir: Path, results: Results) -> None:
    """Kill -9 and restart after registration, after each of `journal_steps` (from an empty
    snapshot: replay only), after a snapshot, and after a snapshot plus `snapshot_tail_steps`
    (the longest a restart replays at the default --snapshot-every, when that is the tail)."""
    with RedisProcess(data_dir / "recovery", appendfsync="everysec") as redis_server:
        results.start_baseline_s = start_baseline(sizes.restarts)
        loop = CrashLoop(sizes, redis_server, results)
        try:
            loop.measure("registration only")
            done = 0
            for steps in sizes.journal_steps:
                loop.run(steps - done, f"journaling {steps:,} mix steps")
                done = steps
                loop.measure(f"{steps:,} steps")
            loop.take_snapshot()
            core = loop.measure(f"snapshot after {sizes.journal_steps[-1]:,} steps")
            time_snapshot_parts(core, results)
            loop.run(sizes.snapshot_tail_steps, f"journaling {sizes.snapshot_tail_steps:,} more")
            loop.measure(f"snapshot + {sizes.snapshot_tail_steps:,} steps")
            results.num_not_ok += loop.client.num_not_ok
        finally:
            loop.allocator.stop()

