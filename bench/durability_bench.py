"""Durability benchmark: what journaling every change to Redis costs a Step, and how long the
allocator takes to come back after a crash.

    .venv/bin/python bench/durability_bench.py            # full run (about three minutes)
    .venv/bin/python bench/durability_bench.py --quick    # smoke run; writes nothing unless told

Three allocators run side by side, each its own `python -m allocator_service` process on
loopback, each durable one with a redis-server of its own (append-only file on, RDB off):

    memory      no --state-url: state lives and dies with the process
    everysec    --state-url, Redis appendfsync everysec (Redis fsyncs its file once a second)
    always      --state-url, Redis appendfsync always (fsync before every reply: no loss)

They get the same requests, interleaved step by step in rotating order so machine noise hits all
three alike, and every comparison is stated as a ratio to memory. Then recovery, on a fourth
Redis: an allocator is killed with SIGKILL after journals of growing length and after a snapshot,
and restarted on the same Redis; the time from spawn to SERVING comes from its own log.
Writes the `## Durability` section of docs/benchmarks.md and docs/img/durability_bench.png.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
# The real-process harnesses live with the tests (see allocator_rpc.py); reuse them.
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))

import bench_report as report  # noqa: E402
from allocator_process import AllocatorProcess  # noqa: E402
from allocator_rpc import StepClient, step_request  # noqa: E402
from allocator_service import redis_codec, snapshot  # noqa: E402
from allocator_service.allocator import Allocator  # noqa: E402
from allocator_service.allocator_servicer import AllocatorServicer  # noqa: E402
from allocator_service.inspection import pool_stats  # noqa: E402
from allocator_service.ops import BlockOp  # noqa: E402
from allocator_service.redis_store import RedisStore  # noqa: E402
from allocator_service.state import AllocatorState  # noqa: E402
from allocator_service.state_store import MemoryStore, StateStore  # noqa: E402
from allocator_workload import DecodeBatch, ServingMix  # noqa: E402
from pagedserve.allocator.v1 import allocator_pb2 as pb  # noqa: E402
from redis_process import RedisProcess  # noqa: E402

TARGET_RATIO = 1.5
TARGET_BATCH = 256
# The two workloads of the in-process measurement.
DECODE = f"decode, {TARGET_BATCH} appends"
MIX = "serving mix"
# Long enough that no pool is reclaimed while its allocator waits for its turn.
LEASE_TTL = "3600"
NO_SNAPSHOTS = str(10**9)
# The allocator's own log lines that mark its start-up (see allocator_service/__main__.py).
LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
SERVING_LINE = re.compile(LOG_TIME + r"allocator INFO \[-\] allocator: serving$", re.M)
SNAPSHOT_LINE = re.compile(r"snapshot at (\d+) written in (\d+) ms")


@dataclass(slots=True, frozen=True)
class Config:
    name: str
    label: str
    # None: in memory, no Redis.
    appendfsync: str | None
    color: str


CONFIGS = (Config("memory", "in memory", None, "#4c72b0"),
           Config("everysec", "Redis, appendfsync everysec", "everysec", "#dd8452"),
           Config("always", "Redis, appendfsync always", "always", "#c44e52"))
DURABLE = CONFIGS[1:]


@dataclass(slots=True, frozen=True)
class Sizes:
    num_blocks: int = 16_384
    block_size: int = 16
    # Decode appends per Step. Each batch size gets a pool of its own, of sequences with
    # 128-token prompts: at 256 sequences it holds about 850 steps.
    batches: tuple[int, ...] = (1, 16, 64, 256)
    latency_warmup_steps: int = 50
    latency_steps: int = 800
    handler_steps: int = 400
    mix_warmup_steps: int = 300
    mix_steps: int = 1_500
    # Serving-mix steps journaled before each kill (cumulative), then after the snapshot.
    journal_steps: tuple[int, ...] = (1_000, 10_000)
    snapshot_tail_steps: int = 1_000
    # Kill-and-restart cycles per recovery point (the median is reported).
    restarts: int = 5


QUICK = Sizes(batches=(1, 256), latency_warmup_steps=3, latency_steps=20, handler_steps=10,
              mix_warmup_steps=5, mix_steps=20, journal_steps=(20, 60), snapshot_tail_steps=20,
              restarts=1)


@dataclass(slots=True)
class RecoveryPoint:
    label: str
    # Journal entries after the last snapshot when the allocator was killed, and their size.
    journal_entries: int
    journal_bytes: int
    # Spawn of the restarted process to its "serving" log line, per restart.
    serving_s: list[float] = field(default_factory=list)
    # RedisStore.load of the same data in the benchmark process (snapshot + journal replay).
    load_s: float = 0.0


@dataclass(slots=True)
class Results:
    num_blocks: int
    block_size: int
    load_at_start: float = float("nan")
    redis_version: str = ""
    disk: str = ""
    fsync_p50_ms: float = float("nan")
    # batch -> config name -> client-side Step latencies over loopback (s).
    latency: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    # Commands each durable allocator journaled during the measurements above, and the highest
    # snapshot it took meanwhile (0: none).
    commands_journaled: int = 0
    snapshot_during: int = 0
    # workload -> config name -> the servicer's Step handler in-process, and the store commit
    # inside it (s); KV events (one XADD each) and request bytes (the journal entry) per step.
    handler: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    commit: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    events_per_step: dict[str, float] = field(default_factory=dict)
    journal_bytes_per_step: dict[str, float] = field(default_factory=dict)
    mix_ops_s: dict[str, float] = field(default_factory=dict)
    mix_ops_per_step: float = 0.0
    # Recovery, on its own Redis (appendfsync everysec).
    start_baseline_s: list[float] = field(default_factory=list)
    recovery: list[RecoveryPoint] = field(default_factory=list)
    recovery_step_s: list[float] = field(default_factory=list)
    snapshot_step_s: float = 0.0
    snapshot_written_ms: float = float("nan")
    snapshot_bytes: int = 0
    snapshot_json_bytes: int = 0
    snapshot_capture_s: float = 0.0
    snapshot_encode_s: float = 0.0
    pool_state: str = ""
    num_not_ok: int = 0


# -- the three allocators --------------------------------------------------------------------

@dataclass(slots=True)
class Target:
    config: Config
    allocator: AllocatorProcess
    channel: grpc.Channel
    redis: RedisProcess | None


def start_targets(stack: ExitStack, data_dir: Path, results: Results) -> list[Target]:
    targets = []
    for config in tqdm(CONFIGS, desc="starting allocators", leave=False):
        args = ["--lease-ttl", LEASE_TTL]
        redis_server = None
        if config.appendfsync is not None:
            redis_server = stack.enter_context(
                RedisProcess(data_dir / config.name, appendfsync=config.appendfsync))
            args += ["--state-url", redis_server.url]
            results.redis_version = str(redis_server.client().info("server")["redis_version"])
        allocator = stack.enter_context(AllocatorProcess(*args))
        channel = allocator.channel()
        grpc.channel_ready_future(channel).result(timeout=15)
        targets.append(Target(config, allocator, channel, redis_server))
    return targets


def rotated(count: int, step: int) -> list[int]:
    """0..count-1 starting at step % count: every configuration goes first equally often."""
    first = step % count
    return list(range(first, count)) + list(range(first))


# -- 1. Step latency over loopback -----------------------------------------------------------

def bench_latency(sizes: Sizes, targets: list[Target], results: Results) -> None:
    """Decode steps of `batch` appends, one Step per allocator in turn; client-side time of the
    call alone (the request is built before the clock starts)."""
    for batch in sizes.batches:
        clients = [StepClient(t.channel, f"decode-{batch}", sizes.num_blocks, sizes.block_size)
                   for t in targets]
        work = [DecodeBatch(batch, seed=batch) for _ in targets]
        for client, decode in zip(clients, work):
            client.step(decode.allocations())
        samples: dict[str, list[float]] = {t.config.name: [] for t in targets}
        total = sizes.latency_warmup_steps + sizes.latency_steps
        for step in tqdm(range(total), desc=f"Step latency, {batch} appends", unit="step",
                         leave=False):
            for index in rotated(len(targets), step):
                client = clients[index]
                request = client.request(work[index].next_appends())
                start = time.perf_counter()
                response = client.stub.Step(request)
                elapsed = time.perf_counter() - start
                client.check(response)
                if step >= sizes.latency_warmup_steps:
                    samples[targets[index].config.name].append(elapsed)
        results.latency[batch] = samples
        results.num_not_ok += sum(client.num_not_ok for client in clients)


# -- 2. the Step handler in-process: where the durable time goes -----------------------------

def in_process_store(target: Target, db: int) -> StateStore:
    if target.redis is None:
        return MemoryStore()
    return RedisStore(target.redis.url_for_db(db))


def timed_commits(store: StateStore, sink: list[float]) -> None:
    """Records the duration of every store.commit (the journal write before the reply)."""
    commit = store.commit

    def timed(*args: object) -> None:
        start = time.perf_counter()
        try:
            commit(*args)  # type: ignore[arg-type]
        finally:
            sink.append(time.perf_counter() - start)

    store.commit = timed  # type: ignore[method-assign]


@dataclass(slots=True)
class InProcess:
    """A servicer on one store, with one registered pool, driven by the benchmark directly."""
    store: StateStore
    core: Allocator
    servicer: AllocatorServicer
    epoch: int
    step_id: int = 0

    def request(self, ops: Sequence[BlockOp]) -> pb.StepRequest:
        self.step_id += 1
        return step_request("handler", self.epoch, self.step_id, ops)


def in_process(store: StateStore, sizes: Sizes) -> InProcess:
    core = Allocator(lease_ttl_s=float(LEASE_TTL))
    store.load(core)
    servicer = AllocatorServicer(AllocatorState(core, store))
    epoch = servicer.RegisterExecutor(pb.RegisterExecutorRequest(
        executor_id="handler", address="127.0.0.1:0", num_blocks=sizes.num_blocks,
        block_size=sizes.block_size, model_fingerprint="bench"), None).epoch  # type: ignore[arg-type]
    return InProcess(store, core, servicer, epoch)


def bench_handler(sizes: Sizes, targets: list[Target], results: Results, workload: str,
                  first_ops: Sequence[BlockOp] | None, next_ops: Callable[[], list[BlockOp]],
                  warmup_steps: int, steps: int) -> None:
    """AllocatorServicer.Step in this process on MemoryStore and on RedisStore against the two
    Redis servers (a database of their own), the same ops to each, interleaved; the store's
    commit inside it is timed too. The request is built before the clock starts."""
    handlers, commits = [], []
    for target in targets:
        commits.append([])
        store = in_process_store(target, db=len(results.handler) + 1)
        timed_commits(store, commits[-1])
        handlers.append(in_process(store, sizes))
    handler_s: dict[str, list[float]] = {t.config.name: [] for t in targets}
    commit_s: dict[str, list[float]] = {t.config.name: [] for t in targets}
    num_events = num_bytes = 0
    try:
        for handler in handlers:
            if first_ops is not None:
                handler.servicer.Step(handler.request(first_ops), None)  # type: ignore[arg-type]
        events_before = handlers[0].core.events.last_seq
        for step in tqdm(range(warmup_steps + steps), desc=f"handler in-process, {workload}",
                         unit="step", leave=False):
            if step == warmup_steps:
                events_before = handlers[0].core.events.last_seq
            ops = next_ops()
            for index in rotated(len(targets), step):
                handler = handlers[index]
                request = handler.request(ops)
                start = time.perf_counter()
                response = handler.servicer.Step(request, None)  # type: ignore[arg-type]
                elapsed = time.perf_counter() - start
                results.num_not_ok += sum(1 for r in response.results if r.status)
                if step >= warmup_steps:
                    name = targets[index].config.name
                    handler_s[name].append(elapsed)
                    commit_s[name].append(commits[index][-1])
                    if index == 0:
                        num_bytes += request.ByteSize()
        num_events = handlers[0].core.events.last_seq - events_before
    finally:
        for handler in handlers:
            handler.store.close()
    results.handler[workload] = handler_s
    results.commit[workload] = commit_s
    results.events_per_step[workload] = num_events / steps
    results.journal_bytes_per_step[workload] = num_bytes / steps


def bench_handlers(sizes: Sizes, targets: list[Target], results: Results) -> None:
    decode = DecodeBatch(TARGET_BATCH, seed=7)
    bench_handler(sizes, targets, results, DECODE, decode.allocations(), decode.next_appends,
                  sizes.latency_warmup_steps, sizes.handler_steps)
    mix = ServingMix(seed=3, max_running=TARGET_BATCH)
    bench_handler(sizes, targets, results, MIX, None, mix.next_step, sizes.mix_warmup_steps,
                  sizes.handler_steps)


def profile_durable_handler(sizes: Sizes, targets: list[Target], steps: int) -> None:
    """`--profile`: cProfile of the Step handler on RedisStore, each durable configuration,
    for both workloads (requests built before profiling starts)."""
    from allocator_profile import print_profile

    for target in targets:
        if target.redis is None:
            continue
        for workload in (DECODE, MIX):
            handler = in_process(in_process_store(target, db=9), sizes)
            try:
                if workload == DECODE:
                    decode = DecodeBatch(TARGET_BATCH, seed=8)
                    handler.servicer.Step(handler.request(decode.allocations()), None)  # type: ignore[arg-type]
                    next_ops = decode.next_appends
                else:
                    next_ops = ServingMix(seed=8, max_running=TARGET_BATCH).next_step
                for _ in range(Sizes().mix_warmup_steps if workload == MIX else 20):
                    handler.servicer.Step(handler.request(next_ops()), None)  # type: ignore[arg-type]
                requests = [handler.request(next_ops()) for _ in range(steps)]
                print_profile(f"Step handler, {workload}, RedisStore ({target.config.label}), "
                              f"{steps} steps", lambda: [handler.servicer.Step(request, None)  # type: ignore[arg-type]
                                                         for request in requests], top=25)
            finally:
                handler.store.close()


# -- 3. throughput: the serving mix ----------------------------------------------------------

def bench_mix(sizes: Sizes, targets: list[Target], results: Results) -> None:
    """The same scheduler-shaped op stream to every allocator, step by step in turn; block ops
    per second of time spent in the Step call."""
    clients = [StepClient(t.channel, "mix", sizes.num_blocks, sizes.block_size)
               for t in targets]
    mix = ServingMix(seed=1, max_running=TARGET_BATCH)
    elapsed = [0.0] * len(targets)
    num_ops = 0
    total = sizes.mix_warmup_steps + sizes.mix_steps
    for step in tqdm(range(total), desc="serving mix", unit="step", leave=False):
        ops = mix.next_step()
        for index in rotated(len(targets), step):
            client = clients[index]
            request = client.request(ops)
            start = time.perf_counter()
            response = client.stub.Step(request)
            took = time.perf_counter() - start
            client.check(response)
            if step >= sizes.mix_warmup_steps:
                elapsed[index] += took
        if step >= sizes.mix_warmup_steps:
            num_ops += len(ops)
    for target, seconds in zip(targets, elapsed):
        results.mix_ops_s[target.config.name] = num_ops / seconds
    results.mix_ops_per_step = num_ops / sizes.mix_steps
    results.num_not_ok += sum(client.num_not_ok for client in clients)


def journaled(targets: list[Target], results: Results) -> None:
    """How many commands the durable allocators journaled, and whether one took a snapshot."""
    keys = redis_codec.Keys.under(redis_codec.DEFAULT_NAMESPACE)
    for target in targets:
        if target.redis is not None:
            client = target.redis.client()
            snapshot_seq = int(client.hget(keys.meta, "snapshot_seq") or 0)
            results.snapshot_during = max(results.snapshot_during, snapshot_seq)
            results.commands_journaled = max(results.commands_journaled,
                                             snapshot_seq + client.xlen(keys.journal))


# -- 4. recovery after kill -9 ---------------------------------------------------------------

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
    core = Allocator(lease_ttl_s=float(LEASE_TTL))
    store = RedisStore(url)
    try:
        start = time.perf_counter()
        store.load(core)
        return time.perf_counter() - start, core
    finally:
        store.close()


def bench_recovery(sizes: Sizes, data_dir: Path, results: Results) -> None:
    """One allocator journals the serving mix to its Redis; at each point it is killed and
    restarted `restarts` times on the same data, then takes its next step on the same pool."""
    keys = redis_codec.Keys.under(redis_codec.DEFAULT_NAMESPACE)
    with RedisProcess(data_dir / "recovery", appendfsync="everysec") as redis_server:
        store_client = redis_server.client()
        base = ("--lease-ttl", LEASE_TTL, "--state-url", redis_server.url)
        journal_only = (*base, "--snapshot-every", NO_SNAPSHOTS)
        for _ in tqdm(range(sizes.restarts), desc="start-up baseline (memory)", leave=False):
            allocator, serving_s = start_timed("--lease-ttl", LEASE_TTL)
            allocator.stop()
            results.start_baseline_s.append(serving_s)

        allocator, _ = start_timed(*journal_only)
        try:
            client = StepClient(allocator.channel(), "mix", sizes.num_blocks, sizes.block_size)
            mix = ServingMix(seed=2, max_running=TARGET_BATCH)

            def run(steps: int, desc: str) -> None:
                for _ in tqdm(range(steps), desc=desc, unit="step", leave=False):
                    request = client.request(mix.next_step())
                    start = time.perf_counter()
                    client.send(request)
                    results.recovery_step_s.append(time.perf_counter() - start)

            def measure(label: str, flags: Sequence[str]) -> Allocator:
                nonlocal allocator
                journal_bytes = store_client.memory_usage(keys.journal, samples=0) or 0
                point = RecoveryPoint(label, store_client.xlen(keys.journal), journal_bytes)
                for _ in tqdm(range(sizes.restarts), desc=f"kill -9 + restart: {label}",
                              leave=False):
                    kill(allocator)
                    allocator, serving_s = start_timed(*flags)
                    point.serving_s.append(serving_s)
                point.load_s, core = load_in_process(redis_server.url)
                results.recovery.append(point)
                # The restarted allocator serves the same pool: same epoch, step ids go on.
                client.reconnect(allocator.channel())
                run(1, "step after restart")
                return core

            measure("registration only", journal_only)
            done = 0
            for steps in sizes.journal_steps:
                run(steps - done, f"journaling {steps:,} mix steps")
                done = steps
                measure(f"{steps:,} steps", journal_only)

            # A snapshot: the first commit of an allocator started with a small --snapshot-every
            # captures the whole state (in the Step, under the lock); a thread writes it.
            kill(allocator)
            allocator, _ = start_timed(*base, "--snapshot-every", str(sizes.journal_steps[0]))
            client.reconnect(allocator.channel())
            start = time.perf_counter()
            client.step(mix.next_step())
            results.snapshot_step_s = time.perf_counter() - start
            deadline = time.monotonic() + 120
            while store_client.xlen(keys.journal) > 0 or not store_client.exists(keys.snapshot):
                if time.monotonic() > deadline:
                    raise RuntimeError("the snapshot was not written within 120 s:\n"
                                       + allocator.stderr_tail())
                time.sleep(0.05)
            time.sleep(0.2)  # its log line follows the write
            if written := SNAPSHOT_LINE.search(allocator.stderr_tail(500)):
                results.snapshot_written_ms = float(written.group(2))
            blob = store_client.get(keys.snapshot) or b""
            results.snapshot_bytes = len(blob)
            results.snapshot_json_bytes = len(zlib.decompress(blob))

            core = measure(f"snapshot after {sizes.journal_steps[-1]:,} steps", journal_only)
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

            run(sizes.snapshot_tail_steps, f"journaling {sizes.snapshot_tail_steps:,} more")
            measure(f"snapshot + {sizes.snapshot_tail_steps:,} steps", journal_only)
            results.num_not_ok += client.num_not_ok
        finally:
            allocator.stop()


# -- the machine -----------------------------------------------------------------------------

def describe_disk(path: Path) -> str:
    """The file system and device holding `path`, from /proc/mounts."""
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                device, mount_point, fs_type = line.split()[:3]
                if str(path.resolve()).startswith(mount_point) and len(mount_point) >= len(best[0]):
                    best = (mount_point, fs_type, device)
    except OSError:
        pass
    return f"{best[1]} on {best[2]}"


def fsync_p50_ms(directory: Path, count: int = 100) -> float:
    """Median fdatasync of a small append in `directory`: what appendfsync always waits for."""
    path = directory / "fsync-probe"
    times = []
    with open(path, "ab") as probe:
        for _ in range(count):
            probe.write(b"x" * 2048)
            probe.flush()
            start = time.perf_counter()
            os.fdatasync(probe.fileno())
            times.append(time.perf_counter() - start)
    path.unlink()
    return statistics.median(times) * 1e3


# -- report ----------------------------------------------------------------------------------

def ms(samples: Sequence[float], q: float) -> float:
    return report.percentile(samples, q) * 1e3


def latency_ratio(r: Results, batch: int, config: str, q: float = 50) -> float:
    samples = r.latency[batch]
    return ms(samples[config], q) / ms(samples["memory"], q)


def latency_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["appends per Step"] + [f"{c.name} p50 / p90 / p99 (ms)" for c in CONFIGS] + [
        f"{c.name} / memory, p50 (p99)" for c in DURABLE]
    rows = []
    for batch, samples in r.latency.items():
        row = [str(batch)]
        row += [" / ".join(f"{ms(samples[c.name], q):.2f}" for q in (50, 90, 99))
                for c in CONFIGS]
        row += [f"{latency_ratio(r, batch, c.name):.2f}× ({latency_ratio(r, batch, c.name, 99):.2f}×)"
                for c in DURABLE]
        rows.append(row)
    return header, rows


def recovery_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["killed with", "journal entries", "journal in Redis", "kill -9 → SERVING (median)",
              "load in-process"]
    rows = [["(baseline: memory allocator, no Redis)", "—", "—",
             f"{statistics.median(r.start_baseline_s):.2f} s", "—"]]
    for point in r.recovery:
        rows.append([point.label, f"{point.journal_entries:,}",
                     f"{point.journal_bytes / 2**20:.1f} MiB",
                     f"{statistics.median(point.serving_s):.2f} s", f"{point.load_s:.2f} s"])
    return header, rows


def target_met(r: Results, config: str) -> bool:
    return latency_ratio(r, TARGET_BATCH, config) <= TARGET_RATIO


def result_rows(r: Results) -> list[report.Row]:
    Row = report.Row
    rows = []
    if TARGET_BATCH in r.latency:
        for c in DURABLE:
            ratio = latency_ratio(r, TARGET_BATCH, c.name)
            rows.append(Row(f"{TARGET_BATCH}-op `Step` p50 over loopback: durable/memory, "
                            f"appendfsync {c.appendfsync}", f"{ratio:.2f}×",
                            f"≤ {TARGET_RATIO}×", ratio <= TARGET_RATIO))
    names = " / ".join(c.name for c in CONFIGS)
    for workload, samples in r.handler.items():
        handler = {name: ms(values, 50) for name, values in samples.items()}
        commit = {name: ms(values, 50) for name, values in r.commit[workload].items()}
        rows += [
            Row(f"in-process `Step` handler, {workload}, p50: {names}",
                " / ".join(f"{handler[c.name]:.2f}" for c in CONFIGS) + " ms"),
            Row(f"of which the store's commit, p50: {names}",
                " / ".join(f"{commit[c.name]:.2f}" for c in CONFIGS) + " ms"),
            Row("what one commit writes: journal entry, KV events (one XADD each)",
                f"{r.journal_bytes_per_step[workload] / 1024:.1f} KiB, "
                f"{r.events_per_step[workload]:.1f} events"),
        ]
    rows += [
        Row(f"serving mix over gRPC, {r.mix_ops_per_step:.0f} ops per Step (block ops/s): "
            f"{names}", " / ".join(f"{r.mix_ops_s[c.name]:,.0f}" for c in CONFIGS)),
        Row("serving mix ops/s: durable/memory (everysec / always)",
            " / ".join(f"{r.mix_ops_s[c.name] / r.mix_ops_s['memory']:.2f}×" for c in DURABLE)),
    ]
    if r.recovery:
        worst = max(r.recovery, key=lambda point: point.journal_entries)
        snap = next(p for p in r.recovery if p.label.startswith("snapshot after"))
        rows += [
            Row(f"restart after kill -9 → SERVING, {worst.journal_entries:,} journal entries "
                "to replay", f"{statistics.median(worst.serving_s):.2f} s"),
            Row("restart after kill -9 → SERVING, from a snapshot (empty journal)",
                f"{statistics.median(snap.serving_s):.2f} s"),
            Row("snapshot size in Redis (zlib JSON; uncompressed JSON)",
                f"{r.snapshot_bytes / 1024:,.0f} KiB ({r.snapshot_json_bytes / 1024:,.0f} KiB)"),
            Row("snapshot: capture (inside the Step that triggers it) / encode / write "
                "(thread)", f"{r.snapshot_capture_s * 1e3:.0f} / {r.snapshot_encode_s * 1e3:.0f}"
                f" / {r.snapshot_written_ms:.0f} ms"),
            Row("the Step that triggered the snapshot / a mix Step p50 (client-side)",
                f"{r.snapshot_step_s * 1e3:.1f} / {ms(r.recovery_step_s, 50):.1f} ms"),
        ]
    rows.append(Row("ops whose result was not OK (sanity check)", f"{r.num_not_ok}", "0",
                    r.num_not_ok == 0))
    return rows


def target_lines(r: Results) -> list[str]:
    return [f"{TARGET_BATCH}-op Step p50: durable/memory = "
            f"{latency_ratio(r, TARGET_BATCH, c.name):.2f} (target ≤ {TARGET_RATIO}) with "
            f"appendfsync {c.appendfsync}: {'met' if target_met(r, c.name) else 'NOT met'}"
            for c in DURABLE if TARGET_BATCH in r.latency]


def write_plot(r: Results, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    figure, (latency, ratios, recovery) = plt.subplots(1, 3, figsize=(17, 5.5))
    batches = list(r.latency)
    for offset, c in zip((-0.1, 0.0, 0.1), CONFIGS):
        xs = [b * (1 + offset) for b in batches]
        p50 = [ms(r.latency[b][c.name], 50) for b in batches]
        p90 = [ms(r.latency[b][c.name], 90) for b in batches]
        p99 = [ms(r.latency[b][c.name], 99) for b in batches]
        latency.plot(xs, p50, "o-", color=c.color, label=f"{c.label}: p50")
        latency.vlines(xs, p50, p99, color=c.color, alpha=0.35, linewidth=4)
        latency.plot(xs, p90, "_", color=c.color, markersize=10)
    latency.plot([], [], color="grey", alpha=0.35, linewidth=4, label="bar: p50 to p99, tick: p90")
    for axis in (latency, ratios):
        axis.set_xscale("log")
        axis.xaxis.set_major_locator(FixedLocator(batches))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_xlabel("decode appends per Step")
    latency.set_yscale("log")
    latency.yaxis.set_major_locator(FixedLocator([0.2, 0.5, 1, 2, 5, 10, 20, 50]))
    latency.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    latency.yaxis.set_minor_formatter(NullFormatter())
    latency.set_ylabel("Step latency, client-side over loopback (ms, log scale)")
    latency.set_title("Step latency by batch size")
    latency.legend(fontsize=8)

    for c in DURABLE:
        ratios.plot(batches, [latency_ratio(r, b, c.name) for b in batches], "o-",
                    color=c.color, label=f"{c.name}: p50")
        ratios.plot(batches, [latency_ratio(r, b, c.name, 99) for b in batches], "o--",
                    color=c.color, alpha=0.5, label=f"{c.name}: p99")
    ratios.plot([TARGET_BATCH / 1.6, TARGET_BATCH * 1.25], [TARGET_RATIO] * 2, color="black",
                linestyle="--", linewidth=1.2,
                label=f"target at {TARGET_BATCH}: p50 ≤ {TARGET_RATIO}×")
    ratios.axhline(1.0, color="lightgrey", linewidth=0.8)
    ratios.set_ylabel("durable / in memory")
    ratios.set_title("What the journal costs a Step")
    ratios.set_ylim(bottom=0)
    ratios.legend(fontsize=8)

    if r.recovery:
        labels = ["memory\n(baseline)"] + [textwrap.fill(p.label, 14) for p in r.recovery]
        serving = [statistics.median(r.start_baseline_s)] + [
            statistics.median(p.serving_s) for p in r.recovery]
        loads = [0.0] + [p.load_s for p in r.recovery]
        positions = range(len(labels))
        bars = recovery.bar(positions, serving, color="#8fa9d6", label="kill -9 → SERVING")
        recovery.bar(positions, loads, width=0.4, color="#4c72b0",
                     label="of which: load (snapshot + replay), in-process")
        recovery.bar_label(bars, labels=[f"{value:.2f} s" for value in serving], padding=2,
                           fontsize=8)
        recovery.set_xticks(list(positions), labels, fontsize=7)
        recovery.set_ylim(0, max(serving) * 1.25)
        recovery.set_ylabel("seconds")
        recovery.set_xlabel("killed with -9 after: journal since the last snapshot")
        recovery.set_title(f"Restart to SERVING (snapshot {r.snapshot_bytes / 1024:,.0f} KiB)")
        recovery.legend(fontsize=8, loc="upper left")

    figure.suptitle(f"pagedserve allocator durability, {report.today()}: "
                    f"{report.machine_description()}, Redis {r.redis_version}", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def findings(r: Results) -> str:
    """What the recovery numbers mean for the snapshot interval, in numbers."""
    longest = max(r.recovery, key=lambda point: point.journal_entries)
    baseline = statistics.median(r.start_baseline_s)
    per_entry_ms = (statistics.median(longest.serving_s) - baseline) / longest.journal_entries * 1e3
    return (f"Replaying the journal costs about {per_entry_ms:.2f} ms per serving-mix step on "
            f"this machine (it runs each Step again), so the default `--snapshot-every 10000` "
            f"lets a restart take up to about {10_000 * per_entry_ms / 1e3 + baseline:.0f} s; "
            f"in exchange every 10,000th Step pays for capturing the state under the lock "
            f"({r.snapshot_capture_s * 1e3:.0f} ms here, for a pool of "
            f"{r.pool_state.split(':')[0]} and {r.snapshot_json_bytes / 1024**2:.1f} MiB of "
            f"JSON), and a thread then encodes and writes {r.snapshot_bytes / 1024**2:.1f} MiB "
            "while Steps go on.")


def section_body(r: Results, sizes: Sizes, png: Path | None, md: Path) -> str:
    machine = (f"Measured {report.today()} on {report.machine_description()}, everything on "
               f"loopback; Redis {r.redis_version} with its append-only file on {r.disk} (a "
               f"small fdatasync there takes {r.fsync_p50_ms:.2f} ms, median) and RDB off; "
               f"1-minute load average {r.load_at_start:.2f} when the run started.")
    method = (
        "Three `python -m allocator_service` processes run side by side: in memory (no "
        "`--state-url`), and two that journal every change to a redis-server of their own in "
        "one MULTI/EXEC before replying, one with `appendfsync everysec` (Redis fsyncs once a "
        "second: a power loss may cost the last second) and one with `appendfsync always` "
        "(fsync before Redis replies: nothing acknowledged is lost). Snapshots at the default "
        f"`--snapshot-every 10000`: each durable allocator journaled {r.commands_journaled:,} "
        "commands here, " + ("so none took a snapshot during the measurement. "
                             if not r.snapshot_during else "and took a snapshot meanwhile. ") +
        "Each gets the same requests, "
        "one Step per allocator in turn, the order rotating every step, so noise hits all "
        "three alike. Latency: decode steps of N sequences appending one token each "
        f"({sizes.latency_steps} timed steps per size, each size on a pool of its own of "
        f"{r.num_blocks:,} blocks × {r.block_size}), client-side time of the `Step` call. "
        "The sequences start equally long, so every 16th step fills a block in each of them "
        "at once: N KV events, one XADD each, in that step's MULTI, which shows in p99. "
        "In-process: `AllocatorServicer.Step` called directly on `MemoryStore` and on "
        "`RedisStore` (same Redis servers, another database), the same ops to each in turn, "
        f"{sizes.handler_steps} timed steps of each workload, with the store's commit timed "
        "inside it. Throughput: the scheduler-shaped serving mix of the allocator benchmark "
        "(up to 256 running sequences), block ops per second of time in the `Step` call. "
        "Recovery, on a fourth Redis (everysec): one allocator journals the serving mix with "
        "snapshots off, is killed with SIGKILL at each point and restarted on the same Redis "
        f"({sizes.restarts} times; median), then takes its next step on the same pool (same "
        "epoch, step ids go on). Time to SERVING runs from spawning the process to its "
        "`serving` log line; the load column is `RedisStore.load` of the same data in the "
        "benchmark process. The snapshot is taken by the first Step of an allocator restarted "
        f"with a small `--snapshot-every`, of a pool in this state: {r.pool_state}.")
    lat_header, lat_rows = latency_grid(r)
    rec_header, rec_rows = recovery_grid(r)
    lines = [
        textwrap.fill(machine, 100), "",
        f"Command: `{report.command_line()}`", "",
        textwrap.fill(method, 100), "",
        *(f"- **{line}**" for line in target_lines(r)), "",
        *([textwrap.fill(findings(r), 100), ""] if r.recovery else []),
        report.markdown_grid(lat_header, lat_rows), "",
        report.markdown_table(result_rows(r)), "",
        "Recovery after `kill -9`:", "",
        report.markdown_grid(rec_header, rec_rows),
    ]
    if png is not None:
        relative = Path(os.path.relpath(png.resolve(), md.resolve().parent))
        lines += ["", f"![durability benchmark]({relative.as_posix()})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny smoke run; writes the doc and plot only when given explicitly")
    parser.add_argument("--out-md", type=Path, default=None,
                        help="markdown page whose `## Durability` section is replaced "
                             "(default docs/benchmarks.md; none with --quick)")
    parser.add_argument("--out-png", type=Path, default=None,
                        help="plot (default docs/img/durability_bench.png; none with --quick)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the redis-servers keep their files (default: a fresh "
                             "temporary directory, removed afterwards); fsync cost depends on it")
    parser.add_argument("--profile", action="store_true",
                        help="afterwards, print cProfile's hottest functions of the Step handler "
                             "on RedisStore (not timed, not written)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    out_md = args.out_md or (None if args.quick else ROOT / "docs" / "benchmarks.md")
    out_png = args.out_png or (None if args.quick else ROOT / "docs/img/durability_bench.png")

    data_dir = Path(tempfile.mkdtemp(prefix="pagedserve-durability-", dir=args.data_dir))
    results = Results(sizes.num_blocks, sizes.block_size, load_at_start=os.getloadavg()[0],
                      disk=describe_disk(data_dir), fsync_p50_ms=fsync_p50_ms(data_dir))
    if results.disk.startswith("tmpfs"):
        print(f"warning: {data_dir} is on tmpfs, where fsync costs nothing; pass --data-dir "
              "on a real disk", file=sys.stderr)
    try:
        with ExitStack() as stack:
            targets = start_targets(stack, data_dir, results)
            bench_latency(sizes, targets, results)
            bench_mix(sizes, targets, results)
            journaled(targets, results)
            bench_handlers(sizes, targets, results)
            if args.profile:
                profile_durable_handler(sizes, targets, steps=50 if args.quick else 300)
        bench_recovery(sizes, data_dir, results)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)

    print(report.text_grid(*latency_grid(results)))
    print()
    print(report.text_table(result_rows(results)))
    print()
    print(report.text_grid(*recovery_grid(results)))
    print()
    print("\n".join(target_lines(results)))
    if out_png is not None:
        write_plot(results, out_png)
        print(f"plot: {out_png}")
    if out_md is not None:
        replace_section(out_md, results, sizes, out_png)
        print(f"results: {out_md} (## Durability)")


def replace_section(out_md: Path, results: Results, sizes: Sizes, out_png: Path | None) -> None:
    report.replace_section(out_md, "Durability", section_body(results, sizes, out_png, out_md))


if __name__ == "__main__":
    sys.exit(main())
