"""The fleet benchmark's two phases, each in its own processes so that none of them is timed
by another's work:

1. `record`: an allocator service and a few simulated executors (sim_executor.py, one process
   each) serving for a while; their Step streams and what they waited on.
2. `replay_point`: a fresh allocator service (in memory, or durable on a fresh redis-server
   with appendfsync everysec) and one replay driver (replay.py) playing N executors' streams.
   The allocator's CPU time over the measured window comes from /proc.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench.fleet.replay import ReplayResult
from pagedserve.supervisor.redis_server import RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess

# No pool of a replay is reclaimed while the driver is still registering the others.
LEASE_TTL = "600"
# The sweep's durable allocators take no snapshot: each one's child process would take a core of
# this 2-core machine for seconds (durability.md). Their cost is measured apart (`snapshots` of
# replay_point).
NO_SNAPSHOTS = 10**9
# Nor does the sweep's Redis rewrite its append-only file. Without snapshots the journal is
# never trimmed, so each automatic rewrite (a forked child writing the whole dataset, at every
# doubling of the file: ten times in a 50 s replay of 64 executors) copies more than the last,
# and on 2 cores the child competes with the allocator and the driver: a 64-executor replay at
# 20 ms had Redis answers of 7-19 ms and 9 stalls with rewrites, at most 3.5 ms and none without
# (2026-11-28). A deployment's Redis does this on cores of its own; the replay with snapshots
# (`snapshots` of replay_point) keeps Redis's default rewrites, to measure both together.
# A snapshot's log line (allocator_service/durability/snapshot_writer.py).
SNAPSHOT_LINE = re.compile(r"snapshot at \d+ written in (\d+) ms, by a child process forked in "
                           r"([\d.]+) ms")
STORES = ("memory", "redis")


@dataclass(frozen=True, slots=True)
class Timing:
    # Long enough that the measured window lies where a fleet's pools spend their lives: past
    # the first pass through their free lists. Until then a taken block held no cached prefix;
    # after it nearly every one does and is evicted (at 20 ms an executor of 24,576 blocks gets
    # there about 25 s in, and its Steps then cost the allocator about 40 % more).
    record_s: float = 60.0
    warmup_s: float = 30.0
    measure_s: float = 20.0
    spread_s: float = 3.0


def record(out_dir: Path, iteration_ms: float, recorders: int, timing: Timing,
           running: int, step_interval: int, reserve_blocks: int = 1, first_seed: int = 0
           ) -> tuple[list[Path], list[dict]]:
    """Runs `recorders` simulated executors at once, seeded first_seed, first_seed + 1, ...;
    their stream files and summaries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seeds = range(first_seed, first_seed + recorders)
    paths = [out_dir / f"sim-{iteration_ms:g}ms-k{step_interval}-r{reserve_blocks}-{seed}.stream"
             for seed in seeds]
    with AllocatorProcess("--lease-ttl", LEASE_TTL) as allocator:
        sims = [subprocess.Popen(
            [sys.executable, "-m", "bench.fleet.sim_executor", "--target", allocator.target,
             "--executor-id", f"sim-{seed}", "--seconds", str(timing.record_s),
             "--iteration-ms", str(iteration_ms), "--running", str(running), "--seed", str(seed),
             "--step-interval", str(step_interval), "--reserve-blocks", str(reserve_blocks),
             "--out", str(path)], stdout=subprocess.PIPE, text=True)
            for seed, path in zip(seeds, paths)]
        summaries = []
        for sim in sims:
            out, _ = sim.communicate()
            if sim.returncode != 0:
                raise RuntimeError(f"a simulated executor failed (exit {sim.returncode})")
            summaries.append(json.loads(out.strip().splitlines()[-1]))
    return paths, summaries


def record_streams(out_dir: Path, iteration_ms: float, streams: int, recorders: int,
                   timing: Timing, running: int, step_interval: int, reserve_blocks: int = 1
                   ) -> tuple[list[Path], list[dict]]:
    """`streams` distinct streams (each simulated executor seeded apart), recorded `recorders`
    at a time: the replay plays executor k from stream k mod streams, so the more distinct
    streams, the less the replayed executors' load rises and falls together (with 2, every
    burst of a recording came back from half the fleet within the start spread)."""
    paths: list[Path] = []
    summaries: list[dict] = []
    for first in range(0, streams, recorders):
        batch = min(recorders, streams - first)
        batch_paths, batch_summaries = record(out_dir, iteration_ms, batch, timing, running,
                                              step_interval, reserve_blocks, first_seed=first)
        paths += batch_paths
        summaries += batch_summaries
    return paths, summaries


@dataclass(slots=True)
class Snapshots:
    """The snapshots a durable allocator wrote during a replay, from its log."""
    every: int
    # Per snapshot: how long fork() held the Step that asked for it, and the time from the
    # fork to the snapshot written.
    fork_ms: list[float] = field(default_factory=list)
    written_ms: list[float] = field(default_factory=list)

    def read_log(self, log: str) -> None:
        for written, forked in SNAPSHOT_LINE.findall(log):
            self.written_ms.append(float(written))
            self.fork_ms.append(float(forked))


def replay_point(streams: list[Path], executors: int, store: str, timing: Timing,
                 work_dir: Path, seed: int = 0, shards: int = 1,
                 transport: str = "channel", snapshots: Snapshots | None = None
                 ) -> ReplayResult:
    """One replay of `executors` executors against a fresh allocator with `store`, or a fresh
    allocator group of `shards` (durable ones share one Redis, a namespace each); Steps over
    `transport` (replay.py's --transport). Durable allocators take no snapshot and their Redis
    does not rewrite its append-only file, unless `snapshots` is given: then they take one
    every `snapshots.every` commands (it collects their times) and Redis rewrites at its
    defaults."""
    result_path = work_dir / f"replay-{streams[0].stem}-{store}-{executors}-s{shards}.json"
    with ExitStack() as stack:
        args = ["--lease-ttl", LEASE_TTL]
        if store == "redis":
            # A data directory of its own: one that an earlier replay at the same N wrote would
            # be loaded first (seconds for a file never rewritten), and its state with it.
            redis_dir = tempfile.mkdtemp(prefix=f"redis-{executors}-s{shards}-", dir=work_dir)
            # Removed once Redis stopped (registered first, so it runs last): a file that is
            # never rewritten grows by gigabytes in one replay.
            stack.callback(shutil.rmtree, redis_dir, ignore_errors=True)
            redis_server = stack.enter_context(RedisProcess(
                Path(redis_dir), appendfsync="everysec", aof_rewrite=snapshots is not None))
            every = snapshots.every if snapshots is not None else NO_SNAPSHOTS
            args += ["--state-url", redis_server.url, "--snapshot-every", str(every)]
        allocators = [stack.enter_context(AllocatorProcess(
            *args, *(["--state-namespace", f"fleet:shard-{index}"] if store == "redis" else [])))
            for index in range(shards)]
        subprocess.run(
            [sys.executable, "-m", "bench.fleet.replay",
             "--target", ",".join(allocator.target for allocator in allocators),
             "--executors", str(executors),
             "--allocator-pid", ",".join(str(a.process.pid) for a in allocators),
             "--warmup-s", str(timing.warmup_s), "--measure-s", str(timing.measure_s),
             "--spread-s", str(timing.spread_s), "--seed", str(seed), "--transport", transport,
             "--out", str(result_path),
             *map(str, streams)], check=True)
        if snapshots is not None:
            for allocator in allocators:
                snapshots.read_log(allocator.stderr_tail(10_000))
    return ReplayResult(**json.loads(result_path.read_text()))
