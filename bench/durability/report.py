"""What the durability benchmark records and reports: the results, the tables (terminal and
markdown), and its `## Durability` section of docs/benchmarks.md. The plot is plot.py; how the
benchmark measures and how to read it is written once, by hand, in docs/benchmarks.md
(`## Durability: how it is measured`).

Every latency comparison is a ratio to the memory allocator measured in the same run.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.durability.config import (CONFIGS, DEFAULT_SNAPSHOT_EVERY, DURABLE, NO_SNAPSHOTS,
                                     TARGET_BATCH, TARGET_RATIO, Sizes)


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


def ms(samples: Sequence[float], q: float) -> float:
    return report.percentile(samples, q) * 1e3


def latency_ratio(r: Results, batch: int, config: str, q: float = 50) -> float:
    samples = r.latency[batch]
    return ms(samples[config], q) / ms(samples["memory"], q)


def target_met(r: Results, config: str) -> bool:
    return latency_ratio(r, TARGET_BATCH, config) <= TARGET_RATIO


def serving_s(point: RecoveryPoint) -> float:
    return statistics.median(point.serving_s)


def recovery_points(r: Results) -> tuple[RecoveryPoint, RecoveryPoint, RecoveryPoint]:
    """The longest journal replayed without a snapshot, the snapshot alone, and the snapshot
    plus the journal after it (see recovery.bench_recovery for the labels)."""
    longest = max(r.recovery, key=lambda point: point.journal_entries)
    snap = next(p for p in r.recovery if p.label.startswith("snapshot after"))
    tail = next(p for p in r.recovery if p.label.startswith("snapshot + "))
    return longest, snap, tail


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
                     f"{point.journal_bytes / 2**20:.1f} MiB", f"{serving_s(point):.2f} s",
                     f"{point.load_s:.2f} s"])
    return header, rows


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
        longest, snap, tail = recovery_points(r)
        at_default = (f" (about the most the default `--snapshot-every {DEFAULT_SNAPSHOT_EVERY}` "
                      "leaves)" if tail.journal_entries >= DEFAULT_SNAPSHOT_EVERY else "")
        rows += [
            Row(f"restart after kill -9 → SERVING, {longest.journal_entries:,} journal entries "
                "to replay", f"{serving_s(longest):.2f} s"),
            Row("restart after kill -9 → SERVING, from a snapshot (empty journal)",
                f"{serving_s(snap):.2f} s"),
            Row(f"restart after kill -9 → SERVING, snapshot + {tail.journal_entries:,} journal "
                f"entries{at_default}", f"{serving_s(tail):.2f} s"),
            Row("snapshot size in Redis (zlib JSON; uncompressed JSON)",
                f"{r.snapshot_bytes / 1024:,.0f} KiB ({r.snapshot_json_bytes / 1024:,.0f} KiB)"),
            Row("snapshot, in the forked child: capture / encode (each timed alone) / all of it "
                "up to written", f"{r.snapshot_capture_s * 1e3:.0f} / "
                f"{r.snapshot_encode_s * 1e3:.0f} / {r.snapshot_written_ms:.0f} ms"),
            Row("the Step that forked the snapshot / a mix Step p50 (client-side)",
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


def settings_lines(r: Results, sizes: Sizes) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    would_take = r.commands_journaled // DEFAULT_SNAPSHOT_EVERY
    lines = [
        f"Snapshots off (`--snapshot-every {NO_SNAPSHOTS}`): each durable allocator journaled "
        f"{r.commands_journaled:,} commands, so at the default `--snapshot-every "
        f"{DEFAULT_SNAPSHOT_EVERY}` {would_take} of its Steps would have forked a snapshot."
        + (f" One was taken anyway, at command {r.snapshot_during:,}: it is in these numbers."
           if r.snapshot_during else ""),
        f"Latency: {sizes.latency_steps} timed steps per size, each size on a pool of its own of "
        f"{r.num_blocks:,} blocks × {r.block_size}; in-process: {sizes.handler_steps} timed "
        "steps of each workload.",
        f"Recovery: restarts per point {sizes.restarts} (median); the snapshot is of a pool in "
        f"this state: {r.pool_state}."
        + (f" The last point, the snapshot plus {sizes.snapshot_tail_steps:,} steps, is about "
           "the longest replay the default `--snapshot-every` leaves."
           if sizes.snapshot_tail_steps == DEFAULT_SNAPSHOT_EVERY else ""),
    ]
    return lines


def figure_lines(r: Results) -> list[str]:
    """The default --snapshot-every's trade-off, in this run's numbers: replay time on restart
    against a stalled Step every interval."""
    longest, snap, tail = recovery_points(r)
    every = DEFAULT_SNAPSHOT_EVERY
    baseline = statistics.median(r.start_baseline_s)
    # Process start-up is paid by every restart; what is left is replay, per journal entry.
    per_entry_ms = (serving_s(longest) - baseline) / longest.journal_entries * 1e3
    if tail.journal_entries >= every:
        restart = (f"{serving_s(tail):.1f} s measured with the snapshot plus "
                   f"{tail.journal_entries:,} entries")
    else:
        restart = f"about {serving_s(snap) + every * per_entry_ms / 1e3:.1f} s (estimated)"
    return [
        f"Journal replay: about {per_entry_ms:.2f} ms per serving-mix step.",
        f"Restart with the default `--snapshot-every {every}`: {restart}; "
        f"{longest.journal_entries:,} entries without a snapshot took "
        f"{serving_s(longest):.1f} s.",
        f"Every {every:,}th Step forks the process for a snapshot: that Step took "
        f"{r.snapshot_step_s * 1e3:.1f} ms against a mix Step p50 of "
        f"{ms(r.recovery_step_s, 50):.1f} ms. The child then spends about "
        f"{(r.snapshot_capture_s + r.snapshot_encode_s) * 1e3:.0f} ms of a core of its own "
        f"capturing and encoding a pool of {r.pool_state.split(':')[0]} "
        f"({r.snapshot_json_bytes / 1024**2:.1f} MiB of JSON) and writes "
        f"{r.snapshot_bytes / 1024**2:.1f} MiB, while Steps go on.",
    ]


def section_body(r: Results, sizes: Sizes, png: Path | None, md: Path) -> str:
    machine = (f"Measured {report.today()} on {report.machine_description()}, everything on "
               f"loopback; Redis {r.redis_version} with its append-only file on {r.disk} (a "
               f"small fdatasync there takes {r.fsync_p50_ms:.2f} ms, median) and RDB off; "
               f"1-minute load average {r.load_at_start:.2f} when the run started.")
    lat_header, lat_rows = latency_grid(r)
    rec_header, rec_rows = recovery_grid(r)
    lines = [
        *report.section_preamble("Durability", machine),
        *(report.list_item(line) for line in settings_lines(r, sizes)), "",
        *(f"- **{line}**" for line in target_lines(r)), "",
        *([*(report.list_item(line) for line in figure_lines(r)), ""] if r.recovery else []),
        report.markdown_grid(lat_header, lat_rows), "",
        report.markdown_table(result_rows(r)), "",
        "Recovery after `kill -9`:", "",
        report.markdown_grid(rec_header, rec_rows),
    ]
    if png is not None:
        lines += ["", report.image_link(png, md, "durability benchmark")]
    return "\n".join(lines)
