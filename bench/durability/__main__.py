"""Durability benchmark: what journaling every change to Redis costs a Step, and how long the
allocator takes to come back after a crash.

    .venv/bin/python -m bench.durability            # full run (about 3.5 minutes)
    .venv/bin/python -m bench.durability --quick    # smoke run; writes nothing unless told

Three allocators run side by side, each its own `python -m allocator_service` process on
loopback, each durable one with a redis-server of its own (append-only file on, RDB off):

    memory      no --state-url: state lives and dies with the process
    everysec    --state-url, Redis appendfsync everysec (Redis fsyncs its file once a second)
    always      --state-url, Redis appendfsync always (fsync before every reply: no loss)

They get the same requests, interleaved step by step in rotating order so machine noise hits all
three alike, and every comparison is stated as a ratio to memory; their snapshots are off, so no
snapshot stall lands in a timed Step (latency.py, handler.py). Then
recovery, on a fourth Redis: an allocator is killed with SIGKILL after journals of growing length,
after a snapshot and after a snapshot plus a default interval of journal, and restarted on the same
Redis; the time from spawn to SERVING comes from its own log (recovery.py).
Writes the `## Durability` section of docs/benchmarks.md (report.py) and
docs/img/durability_bench.png (plot.py).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.durability.config import QUICK, Sizes
from bench.durability.handler import bench_handlers, profile_durable_handler
from bench.durability.latency import bench_latency, bench_mix, journaled, start_targets
from bench.durability.plot import write_plot
from bench.durability.recovery import bench_recovery
from bench.durability.report import (Results, latency_grid, recovery_grid, result_rows,
                                     section_body, target_lines)
from bench.report import add_output_flags, output_paths, replace_section, text_grid, text_table

# -- the machine: what appendfsync always waits for -------------------------------------------

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.durability",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the redis-servers keep their files (default: a fresh "
                             "temporary directory, removed afterwards); fsync cost depends on it")
    parser.add_argument("--profile", action="store_true",
                        help="afterwards, print cProfile's hottest functions of the Step handler "
                             "on RedisStore (not timed, not written)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    out_md, out_png = output_paths(args, "durability_bench.png")

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

    print(text_grid(*latency_grid(results)))
    print()
    print(text_table(result_rows(results)))
    print()
    print(text_grid(*recovery_grid(results)))
    print()
    print("\n".join(target_lines(results)))
    if out_png is not None:
        write_plot(results, out_png)
        print(f"plot: {out_png}")
    if out_md is not None:
        replace_section(out_md, "Durability", section_body(results, sizes, out_png, out_md))
        print(f"results: {out_md} (## Durability)")


if __name__ == "__main__":
    sys.exit(main())
