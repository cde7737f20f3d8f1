"""Fleet benchmark: how many executors one allocator process serves at GPU step rates.

    .venv/bin/python -m bench.fleet            # full run (about 40 minutes)
    .venv/bin/python -m bench.fleet --quick    # smoke run; writes nothing unless told

For each iteration time, a few simulated executors record their Step streams live; then, for
each N of the sweep, a fresh allocator (in memory, then durable on Redis, the order alternating
from one N to the next) serves N replayed executors. A store's sweep stops at its first
saturated point. At the first iteration time, an allocator group (--group-shards shards, in
memory) then serves --group-executors replayed executors, numbered, each registered with the
shard its number gives it, and one more durable allocator serves --snapshot-executors taking
snapshots at the default interval. Writes `## Fleet` of docs/benchmarks.md and
docs/img/fleet_bench.png.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from allocator_service.core.compiled_build import compiled_package_dir
from allocator_service.server.config import build_parser as allocator_flags
from bench.fleet.capacity import (STORES, Snapshots, Timing, record, record_streams,
                                  replay_point)
from bench.fleet.plot import write_plot
from bench.fleet.profile import cost_per_executor_second
from bench.fleet.replay import TRANSPORTS
from bench.fleet.report import (FleetResults, Point, Recording, group_rows, section_body,
                                snapshot_rows, summary_rows)
from bench.fleet.slack import slack_of
from bench.fleet.step_stream import StepStream
from bench.fleet.workload import FleetWorkload
from bench.report import (add_output_flags, command_line, image_link, machine_description,
                          output_paths, replace_section, text_table, today)

QUICK = Timing(record_s=5.0, warmup_s=1.0, measure_s=3.0, spread_s=0.5)


def core_build() -> str:
    """Which allocator core the allocator processes import (they run from this checkout)."""
    return "compiled (mypyc)" if compiled_package_dir() is not None else "interpreted"


def parse_list(text: str, kind=float) -> list:
    return [kind(part) for part in text.split(",") if part]


def compare_intervals(results: FleetResults, it: float, streams: list, args, timing: Timing,
                      work: Path, progress) -> None:
    """The same N replayed from streams recorded at the baseline interval and at the chosen
    one, one after the other: what coalescing Steps saves the allocator."""
    progress.set_description(f"{it:g} ms: recording at step interval {args.baseline_interval}")
    baseline, _ = record(work / f"{it:g}ms-baseline", it, args.recorders, timing, args.running,
                         args.baseline_interval, args.reserve_blocks)
    progress.update(1)
    n = args.baseline_executors
    # As many distinct streams on each side: the baseline records one batch of recorders.
    for interval, paths in ((args.baseline_interval, baseline),
                            (args.step_interval, streams[:len(baseline)])):
        progress.set_description(f"{it:g} ms: {n} executors at step interval {interval}")
        results.interval_points.append((interval, Point(it, "memory", replay_point(
            paths, n, "memory", timing, work, seed=99, transport=args.transport))))
        progress.update(1)


def replay_group(results: FleetResults, it: float, streams: list, args, timing: Timing,
                 work: Path, progress) -> None:
    """The group's replay between two of one allocator at as many executors as a shard has on
    average: the group's efficiency is measured against them, side by side."""
    per_shard = max(1, round(args.group_executors / args.group_shards))
    for step in ("before", "group", "after"):
        if step == "group":
            progress.set_description(f"{it:g} ms: {args.group_executors} executors, "
                                     f"{args.group_shards} shards")
            results.group_points.append(Point(it, "memory", replay_point(
                streams, args.group_executors, "memory", timing, work, seed=77,
                shards=args.group_shards, transport=args.transport)))
        else:
            progress.set_description(f"{it:g} ms: {per_shard} executors, one allocator, "
                                     f"{step} the group")
            results.group_references.append(Point(it, "memory", replay_point(
                streams, per_shard, "memory", timing, work, seed=77,
                transport=args.transport)))
        progress.update(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations-ms", default="20,5",
                        help="iteration times to simulate, comma-separated")
    # The targets among them: 128 and 32 in memory, 0.7 of those (89, 22) durable.
    parser.add_argument("--executors", default="8,16,22,32,48,64,89,128",
                        help="N of the replay sweep, comma-separated")
    parser.add_argument("--streams", type=int, default=8,
                        help="distinct Step streams recorded per iteration time (replayed "
                             "executor k plays stream k mod this)")
    parser.add_argument("--recorders", type=int, default=2,
                        help="simulated executors recording streams live at a time")
    parser.add_argument("--running", type=int, default=256,
                        help="sequences each simulated executor keeps running")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--step-interval", type=int, default=4,
                        help="the simulated executors' --step-interval (coalesced Steps)")
    parser.add_argument("--reserve-blocks", type=int, default=4,
                        help="the simulated executors' --reserve-blocks (blocks an Append "
                             "reserves ahead)")
    parser.add_argument("--baseline-interval", type=int, default=1,
                        help="also record at this interval and replay it beside the other at "
                             "one N, in memory (0: no comparison)")
    parser.add_argument("--baseline-executors", type=int, default=8)
    parser.add_argument("--transport", choices=TRANSPORTS, default="channel",
                        help="how replayed Steps travel: the allocator's Step channel, or "
                             "Step RPCs")
    parser.add_argument("--group-shards", type=int, default=4,
                        help="shards of the allocator group replayed at the first iteration "
                             "time (0: none)")
    parser.add_argument("--group-executors", type=int, default=96,
                        help="executors replayed against the allocator group")
    parser.add_argument("--snapshot-executors", type=int, default=22,
                        help="executors replayed at the first iteration time against a durable "
                             "allocator that takes snapshots (0: none)")
    parser.add_argument("--snapshot-every", type=int,
                        default=allocator_flags().get_default("snapshot_every"),
                        help="that allocator's --snapshot-every (default: the allocator's)")
    add_output_flags(parser)
    args = parser.parse_args(argv)
    timing = QUICK if args.quick else Timing()
    iterations = parse_list(args.iterations_ms)
    sweep = parse_list(args.executors, int)
    stores = [s for s in args.stores.split(",") if s]
    out_md, out_png = output_paths(args, "fleet_bench.png")
    workload = FleetWorkload(target_running=args.running)
    results = FleetResults(
        f"{today()} on {machine_description()}", command_line(),
        workload.describe().replace(f"{workload.arrival_rate:.1f} requests/s",
                                    "the rate that keeps the batch full"),
        f"{args.streams} streams recorded live for {timing.record_s:g} s per iteration time, "
        f"by {args.recorders} simulated executors at a time; each replay starts its executors "
        f"over {timing.spread_s:g} s, warms up for {timing.warmup_s:g} s and measures "
        f"{timing.measure_s:g} s. Simulated executors coalesce Steps with --step-interval "
        f"{args.step_interval} and reserve --reserve-blocks {args.reserve_blocks} blocks per "
        f"Append; the allocator core is {core_build()}; replayed Steps travel over the "
        f"{'Step channel' if args.transport == 'channel' else 'Step RPC'}.")
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as scratch:
        work = Path(scratch)
        compare = args.baseline_interval > 0
        group = args.group_shards > 0
        snapshotting = args.snapshot_executors > 0 and "redis" in stores
        total = (len(iterations) * (1 + len(sweep) * len(stores) + (3 if compare else 0))
                 + 3 * group + snapshotting)
        with tqdm(total=total, unit="run", file=sys.stderr) as progress:
            for it in iterations:
                progress.set_description(f"{it:g} ms: recording {args.streams} streams")
                streams, summaries = record_streams(work / f"{it:g}ms", it, args.streams,
                                                    args.recorders, timing, args.running,
                                                    args.step_interval, args.reserve_blocks)
                progress.set_description(f"{it:g} ms: the Step path in one process")
                # The machine's speed on the first two streams, as every report gives it.
                results.recordings.append(Recording(
                    it, summaries, cost_per_executor_second(streams[:2]),
                    slack_of(StepStream.load(path) for path in streams)))
                progress.update(1)
                saturated: set[str] = set()
                for index, n in enumerate(sweep):
                    order = stores if index % 2 == 0 else stores[::-1]
                    for store in order:
                        if store not in saturated:
                            progress.set_description(f"{it:g} ms: {n} executors, {store}")
                            point = Point(it, store, replay_point(
                                streams, n, store, timing, work, seed=index,
                                transport=args.transport))
                            results.points.append(point)
                            if point.saturated:
                                saturated.add(store)
                        progress.update(1)
                if group and it == iterations[0]:
                    replay_group(results, it, streams, args, timing, work, progress)
                if snapshotting and it == iterations[0]:
                    progress.set_description(f"{it:g} ms: {args.snapshot_executors} executors, "
                                             "redis, with snapshots")
                    snapshots = Snapshots(args.snapshot_every)
                    results.snapshot_points.append((Point(it, "redis", replay_point(
                        streams, args.snapshot_executors, "redis", timing, work,
                        # The sweep's seed at this N: the same start times, for comparison.
                        seed=(sweep.index(args.snapshot_executors)
                              if args.snapshot_executors in sweep else 55),
                        transport=args.transport, snapshots=snapshots)), snapshots))
                    progress.update(1)
                if compare:
                    compare_intervals(results, it, streams, args, timing, work, progress)
    print(text_table(summary_rows(results) + group_rows(results) + snapshot_rows(results)))
    if out_png is not None:
        write_plot(results, out_png)
        print(f"plot: {out_png}")
    if out_md is not None:
        image = image_link(out_png, out_md, "fleet benchmark") if out_png else ""
        replace_section(out_md, "Fleet", section_body(results, image))
        print(f"results: {out_md} (## Fleet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
