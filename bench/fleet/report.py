"""The `## Fleet` section: what the simulated executors waited on, and per replayed point the
allocator's CPU per executor-second, Step latency and stalls, with the capacity they imply."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from bench.fleet.capacity import Snapshots
from bench.fleet.replay import ReplayResult, stall_bursts
from bench.fleet.slack import LITTLE_SLACK_S, Slack
from bench.report import Row, markdown_table, percentile
from pagedserve.common.allocator_shards import balanced_owners

# The targets: executors one allocator process serves with no stall and Step p99 within
# 5 ms, in memory; with Redis (appendfsync everysec) at least 0.7 times as many.
TARGET_EXECUTORS = {20.0: 128, 5.0: 32}
REDIS_SHARE = 0.7
TARGET_P99_MS = 5.0
# An allocator group of 4 shards must hold at least 3.5 times one allocator's executors.
TARGET_GROUP = {4: 3.5}
# How many other address lists the report spreads a group's fleet over: the assignment depends
# on the addresses, so one group's spread is one draw.
OTHER_GROUPS = 200
# A point whose stalls exceed this share of its Steps is saturated: the sweep stops there.
SATURATED_STALL_SHARE = 0.01

# Unsaturated sweep points a CPU line needs before the report extrapolates it to a core.
MIN_LINE_POINTS = 4


@dataclass(slots=True)
class Point:
    iteration_ms: float
    store: str
    result: ReplayResult

    @property
    def executors(self) -> int:
        return self.result.executors

    @property
    def cpu_per_executor(self) -> float:
        """Allocator CPU seconds per executor-second."""
        return self.cores / self.result.executors

    @property
    def cores(self) -> float:
        """The allocator's CPU over the window, in cores."""
        return (self.result.allocator_cpu_s or 0.0) / self.result.window_s

    @property
    def p50_ms(self) -> float:
        return percentile(self.result.latencies_ms, 50) if self.result.latencies_ms else 0.0

    @property
    def p99_ms(self) -> float:
        return percentile(self.result.latencies_ms, 99) if self.result.latencies_ms else 0.0

    @property
    def sustained(self) -> bool:
        """No stall, nothing fell behind, every answer as recorded, p99 within target."""
        r = self.result
        return (r.stalls == 0 and r.behind == 0 and r.mismatches == 0
                and self.p99_ms <= TARGET_P99_MS)

    @property
    def saturated(self) -> bool:
        return self.result.stalls > SATURATED_STALL_SHARE * max(1, self.result.steps)


@dataclass(slots=True)
class Recording:
    iteration_ms: float
    summaries: list[dict]
    # The recorded Steps' path in one process, collector off, in seconds per executor-second
    # (profile.cost_per_executor_second): the machine's speed on this code (0: not measured).
    in_process_s: float = 0.0
    # What the overlapped Steps had left of their pass (None: not measured).
    slack: Slack | None = None


@dataclass(slots=True)
class FleetResults:
    machine: str
    command: str
    workload: str
    timing: str
    recordings: list[Recording] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    # (step interval, point): one N replayed from streams recorded at each interval.
    interval_points: list[tuple[int, Point]] = field(default_factory=list)
    # Replays against an allocator group (several shards), in memory.
    group_points: list[Point] = field(default_factory=list)
    # One allocator, in memory, at a group's executors per shard, replayed right before and
    # right after the group: what a shard would cost alone under the same machine load.
    group_references: list[Point] = field(default_factory=list)
    # Durable replays that took snapshots, and their snapshots.
    snapshot_points: list[tuple[Point, Snapshots]] = field(default_factory=list)

    def of(self, iteration_ms: float, store: str) -> list[Point]:
        return sorted((p for p in self.points if p.iteration_ms == iteration_ms
                       and p.store == store), key=lambda p: p.executors)

    def cpu_per_executor(self, iteration_ms: float, store: str) -> float:
        """The median over the sweep's unsaturated points (the figure is flat in N)."""
        points = [p for p in self.of(iteration_ms, store) if not p.saturated] or \
            self.of(iteration_ms, store)
        return statistics.median(p.cpu_per_executor for p in points) if points else 0.0

    def cpu_line(self, iteration_ms: float, store: str) -> tuple[float, float] | None:
        """(fixed cores, cores per executor): the least-squares line through (N, allocator
        cores) of the sweep's unsaturated points. What one executor costs falls as N grows
        (an event-loop turn and a wakeup serve more Steps), so the cost of one more executor
        is the line's slope, not the cost per executor of a small N. None with fewer than
        MIN_LINE_POINTS points: a line through two or three points of a noisy machine says
        little about where it reaches a core (on 2026-11-28 two points at 5 ms, 8 executors on a
        disturbed minute and 16, put one core at 148 executors where the median said 27)."""
        points = [p for p in self.of(iteration_ms, store) if not p.saturated]
        if len(points) < MIN_LINE_POINTS:
            return None
        slope, intercept = statistics.linear_regression([p.executors for p in points],
                                                        [p.cores for p in points])
        return intercept, slope

    def largest_sustained(self, iteration_ms: float, store: str) -> int:
        return max((p.executors for p in self.of(iteration_ms, store) if p.sustained),
                   default=0)


def target_for(iteration_ms: float, store: str) -> int:
    target = TARGET_EXECUTORS.get(iteration_ms, 0)
    return int(target * REDIS_SHARE) if store == "redis" else target


def summary_rows(results: FleetResults) -> list[Row]:
    rows = []
    for recording in results.recordings:
        it = recording.iteration_ms
        sims = recording.summaries
        seconds = sum(s["seconds"] for s in sims)
        rows.append(Row(f"{it:g} ms: simulated executors (live), Steps/s and ops per Step",
                        f"{sum(s['steps'] for s in sims) / seconds:.1f} /s, "
                        f"{sum(s['ops'] for s in sims) / max(1, sum(s['steps'] for s in sims)):.1f}"
                        " ops"))
        rows.append(Row(f"{it:g} ms: live: mean running sequences, stalls, slot stalls",
                        f"{statistics.fmean(s['mean_running'] for s in sims):.0f}, "
                        f"{sum(s['stalls'] for s in sims)}, "
                        f"{sum(s['slot_stalls'] for s in sims)}", "0 stalls",
                        sum(s["stalls"] + s["slot_stalls"] for s in sims) == 0))
        rows.append(Row(f"{it:g} ms: live: share of time waiting for admission/fork answers",
                        f"{sum(s['blocking_wait_s'] for s in sims) / seconds:.1%}"))
        paced = sum(s["seconds"] / (it / 1000) for s in sims)
        rows.append(Row(f"{it:g} ms: live: iterations run, of as many as keep pace",
                        f"{sum(s['iterations'] for s in sims) / paced:.0%}"))
        if recording.slack is not None and recording.slack.overlapped:
            slack = recording.slack
            rows.append(Row(f"{it:g} ms: overlapped Steps' slack (sent to read) "
                            f"p50 / p10, and share under {LITTLE_SLACK_S * 1000:g} ms",
                            f"{slack.p50_s * 1000:.2f} / {slack.p10_s * 1000:.2f} ms, "
                            f"{slack.little:.0%} of {slack.overlapped:,}"))
        if recording.in_process_s:
            rows.append(Row(f"{it:g} ms: these Steps' path in one process, collector off, per "
                            "executor-second (the machine's speed)",
                            f"{recording.in_process_s * 1000:.2f} ms"))
        for store in ("memory", "redis"):
            if not results.of(it, store):
                continue
            cpu = results.cpu_per_executor(it, store)
            target = target_for(it, store)
            rows.append(Row(f"{it:g} ms, {store}: allocator CPU per executor-second (median "
                            "of the sweep's points)", f"{cpu * 1000:.1f} ms"))
            rows.append(Row(f"{it:g} ms, {store}: executors per allocator core by that "
                            "median (1 / the above)", f"{1 / cpu if cpu else 0:.0f}"))
            line = results.cpu_line(it, store)
            if line is not None:
                fixed, marginal = line
                per_core = (1 - fixed) / marginal if marginal > 0 else 0
                rows.append(Row(f"{it:g} ms, {store}: allocator cores against N (a line "
                                "through the sweep's points)",
                                f"{fixed:.3f} + {marginal * 1000:.2f} ms × N"))
                rows.append(Row(f"{it:g} ms, {store}: executors one allocator core serves "
                                "by that line ((1 − fixed) / per executor)",
                                f"{per_core:.0f}", f"≥ {target}", per_core >= target))
            largest = results.largest_sustained(it, store)
            rows.append(Row(f"{it:g} ms, {store}: largest N replayed with 0 stalls, p99 ≤ "
                            f"{TARGET_P99_MS:g} ms", f"{largest}", f"≥ {target}",
                            largest >= target))
    return rows


def interval_rows(results: FleetResults) -> list[Row]:
    rows = []
    by_iteration: dict[float, list[tuple[int, Point]]] = {}
    for interval, point in results.interval_points:
        by_iteration.setdefault(point.iteration_ms, []).append((interval, point))
    for it, pairs in by_iteration.items():
        for interval, point in pairs:
            r = point.result
            rows.append(Row(f"{it:g} ms, {r.executors} executors, step interval {interval}: "
                            "Steps/s per executor, CPU per executor-s, p99",
                            f"{r.steps / r.window_s / r.executors:.1f}, "
                            f"{point.cpu_per_executor * 1000:.1f} ms, {point.p99_ms:.2f} ms"))
        if len(pairs) == 2 and pairs[1][1].cpu_per_executor:
            (low, base), (high, chosen) = pairs
            rows.append(Row(f"{it:g} ms: allocator CPU per executor, interval {low} / "
                            f"interval {high}",
                            f"{base.cpu_per_executor / chosen.cpu_per_executor:.2f}×"))
    return rows


def replayed_group_ratio(results: FleetResults, point: Point) -> float:
    """The group's capacity over one allocator's as the replayed N alone shows it: one
    allocator holds 1 / c executors per core (c: its median CPU per executor-second); the group
    is full when its busiest shard uses a whole core, so it holds N / (that shard's cores) times
    the executors it replayed. A shard with few executors costs more per executor than one
    with the many a group is for."""
    single = results.cpu_per_executor(point.iteration_ms, "memory")
    r = point.result
    busiest = max(r.shard_cpu_s, default=0.0) / r.window_s
    return r.executors * single / busiest if busiest and single else 0.0


@dataclass(frozen=True, slots=True)
class GroupCapacity:
    # One allocator: executors per core by the sweep's line.
    single: float
    # The shards' CPU per executor over one allocator's at the same executors per process.
    efficiency: float
    # The largest fleet the group holds with no shard past a core, and its spread.
    executors: int
    spread: tuple[int, ...]
    # The same fleet over other groups' addresses: the median and the 5th percentile.
    median_executors: int
    low_executors: int

    @property
    def ratio(self) -> float:
        return self.executors / self.single


def group_efficiency(results: FleetResults, point: Point) -> float | None:
    """The shards' CPU per executor over one allocator's at the same executors per process,
    measured side by side: one allocator replayed at the group's executors per shard right
    before and right after the group, so that both sides see the same machine (on a shared
    machine the cost per executor drifts by 10 % or more between the sweep and the group's
    run). None without those replays or the shards' CPU."""
    r = point.result
    references = [p for p in results.group_references
                  if p.iteration_ms == point.iteration_ms and p.cores > 0]
    if not references or not r.shard_executors or sum(r.shard_cpu_s) <= 0:
        return None
    alone = statistics.mean(p.cpu_per_executor for p in references)
    return sum(r.shard_cpu_s) / r.window_s / sum(r.shard_executors) / alone


def group_capacity(results: FleetResults, point: Point) -> GroupCapacity | None:
    """The group's capacity from the replay and the single allocator's line (fixed + per
    executor × N cores): a shard of the group costs what one allocator costs at its executors,
    times the efficiency the replay measured (group_efficiency). The fleet grows an executor at
    a time (numbered as the replay numbers them, each to the shard its index gives it among
    this group's addresses) until the busiest shard would need more than a core. None without a
    line, the replays beside the group or the shards' CPU."""
    line = results.cpu_line(point.iteration_ms, "memory")
    r = point.result
    if line is None or not r.shard_targets or line[1] <= 0:
        return None
    fixed, per_executor = line
    efficiency = group_efficiency(results, point)
    if efficiency is None:
        return None
    fleet, spread = fleet_held(r.shard_targets, efficiency * fixed, efficiency * per_executor)
    others = sorted(fleet_held(other_group(len(r.shard_targets), seed), efficiency * fixed,
                               efficiency * per_executor)[0] for seed in range(OTHER_GROUPS))
    return GroupCapacity((1 - fixed) / per_executor, efficiency, fleet, spread,
                         others[len(others) // 2], others[len(others) // 20])


def other_group(shards: int, seed: int) -> list[str]:
    return [f"10.{seed // 256}.{seed % 256}.{index + 1}:50052" for index in range(shards)]


def fleet_held(targets: list[str], fixed: float, per_executor: float
               ) -> tuple[int, tuple[int, ...]]:
    """Grows a fleet an executor at a time (numbered as the replay numbers them, each to the
    shard its index gives it among `targets`) until the next one would take its shard past a
    core at fixed + per_executor × N cores; the fleet and its spread."""
    # No shard holds more than this, so the fleet ends before every shard holds it.
    per_shard = max(0, math.floor((1 - fixed) / per_executor) + 1)
    counts = [0] * len(targets)
    for fleet, shard in enumerate(balanced_owners(len(targets) * per_shard + 1, targets)):
        owner = targets.index(shard)
        if fixed + per_executor * (counts[owner] + 1) > 1:
            return fleet, tuple(counts)
        counts[owner] += 1
    raise AssertionError("a fleet past every shard's capacity fits")


def group_rows(results: FleetResults) -> list[Row]:
    rows = []
    for point in results.group_points:
        r, it = point.result, point.iteration_ms
        shards = len(r.shard_executors)
        head = f"{it:g} ms, memory, {shards} shards, {r.executors} executors"
        rows.append(Row(f"{head}: executors per shard",
                        " / ".join(map(str, r.shard_executors))))
        rows.append(Row(f"{head}: each shard's CPU per executor-second",
                        " / ".join(f"{cpu / (n * r.window_s) * 1000:.1f} ms" if n else "–"
                                   for cpu, n in zip(r.shard_cpu_s, r.shard_executors))))
        rows.append(Row(f"{head}: Step p50 / p99, stalls, answers differing",
                        f"{point.p50_ms:.2f} / {point.p99_ms:.2f} ms, {r.stalls}, "
                        f"{r.mismatches}", "0 stalls, 0 differing",
                        r.stalls == 0 and r.mismatches == 0))
        rows.append(Row(f"{head}: capacity over one allocator's at this N (N × median CPU "
                        "per executor / busiest shard's cores)",
                        f"{replayed_group_ratio(results, point):.2f}×"))
        references = [p for p in results.group_references if p.iteration_ms == it]
        if references:
            rows.append(Row(f"{it:g} ms, memory, one allocator at {references[0].executors} "
                            "executors, right before and right after: CPU per executor-second",
                            " / ".join(f"{p.cpu_per_executor * 1000:.1f} ms"
                                       for p in references)))
        capacity = group_capacity(results, point)
        if capacity is None:
            continue
        target = TARGET_GROUP.get(shards)
        rows.append(Row(f"{head}: the shards' CPU per executor over one allocator's at as many "
                        "executors per process (efficiency)", f"{capacity.efficiency:.2f}×"))
        rows.append(Row(f"{shards} shards: the largest fleet with no shard past a core "
                        "(executors per shard)",
                        f"{capacity.executors} ({' / '.join(map(str, capacity.spread))})"))
        rows.append(Row(f"{shards} shards: the group's capacity over one allocator's "
                        f"({capacity.executors} / {capacity.single:.0f})",
                        f"{capacity.ratio:.2f}×", f"≥ {target:g}×" if target else "",
                        capacity.ratio >= target if target else None))
        rows.append(Row(f"{shards} shards: the same over {OTHER_GROUPS} other address lists, "
                        "median / 5th percentile",
                        f"{capacity.median_executors / capacity.single:.2f}× / "
                        f"{capacity.low_executors / capacity.single:.2f}×"))
    return rows


def snapshot_rows(results: FleetResults) -> list[Row]:
    rows = []
    for point, snapshots in results.snapshot_points:
        r, it = point.result, point.iteration_ms
        head = f"{it:g} ms, redis, {r.executors} executors"
        forks = snapshots.fork_ms
        rows.append(Row(f"{head}, --snapshot-every {snapshots.every:,}: snapshots written; "
                        "fork (median / max); fork to written (median)",
                        f"{len(forks)}; {statistics.median(forks):.1f} / {max(forks):.1f} ms; "
                        f"{statistics.median(snapshots.written_ms) / 1000:.1f} s" if forks
                        else "0"))
        without = [p for p in results.of(it, "redis") if p.executors == r.executors]
        for label, each in ([("with snapshots", point)]
                            + [("without (the sweep's point)", p) for p in without]):
            latencies = each.result.latencies_ms
            rows.append(Row(f"{head}, {label}: Step p50 / p99 / max, stalls, behind",
                            f"{each.p50_ms:.2f} / {each.p99_ms:.2f} / "
                            f"{max(latencies, default=0.0):.1f} ms, {each.result.stalls}, "
                            f"{each.result.behind}"))
    return rows


def point_table(results: FleetResults) -> str:
    header = ("| iteration | store | N | Steps/s | ops/s | allocator CPU (cores) | CPU per "
              "executor-s | p50 / p99 (ms) | stalls (bursts) | behind | answers differing | "
              "CPU the host took (ms) |\n"
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [header]
    for p in sorted(results.points, key=lambda p: (-p.iteration_ms, p.store, p.executors)):
        r = p.result
        lines.append(
            f"| {p.iteration_ms:g} ms | {p.store} | {r.executors} | {r.steps / r.window_s:,.0f} "
            f"| {r.ops / r.window_s:,.0f} | {(r.allocator_cpu_s or 0) / r.window_s:.2f} | "
            f"{p.cpu_per_executor * 1000:.1f} ms | {p.p50_ms:.2f} / {p.p99_ms:.2f} | "
            f"{stalls_and_bursts(r)} | {r.behind} | {r.mismatches} | {stolen_ms(r)} |")
    return "\n".join(lines)


def stolen_ms(result: ReplayResult) -> str:
    return "—" if result.stolen_s is None else f"{result.stolen_s * 1000:,.0f}"


def stalls_and_bursts(result: ReplayResult) -> str:
    if not result.stalls or not result.stalled_at_s:  # results from before bursts were kept
        return f"{result.stalls}"
    return f"{result.stalls} ({stall_bursts(result.stalled_at_s)})"


def section_body(results: FleetResults, image: str) -> str:
    """`image`: the markdown that shows the plot (empty: none)."""
    return "\n".join([
        f"Measured on {results.machine}.", "",
        f"Command: `{results.command}`", "",
        "Method and reading: [Fleet: how it is measured](#fleet-how-it-is-measured).", "",
        f"- Workload per executor: {results.workload}.",
        f"- {results.timing}", "",
        markdown_table(summary_rows(results)), "",
        "Coalesced Steps: the same N replayed from streams recorded with and without them:", "",
        markdown_table(interval_rows(results)), "",
        "An allocator group: the executors spread over the shards by their indexes "
        "(rendezvous hashing with bounded loads), one replay against fresh shards:", "",
        markdown_table(group_rows(results)), "",
        "Snapshots: the sweep's durable allocators take none; one more durable replay takes "
        "them at the default interval, each by a forked child "
        "([durability.md](durability.md#what-is-stored-under-which-keys)):", "",
        markdown_table(snapshot_rows(results)), "",
        "Every replayed point (N executors, one fresh allocator each):", "",
        point_table(results), "",
        image, ""])
