"""Memory benchmark: how much of the KV cache holds real tokens, and how many sequences fit in
it, under pagedserve's allocator and under per-request contiguous reservation.

    .venv/bin/python -m bench.memory            # 800 chat-like requests (2-3 minutes, 2 cores)
    .venv/bin/python -m bench.memory --quick    # smoke run; writes nothing unless told

Replays one chat-like workload (ShareGPT-like lengths, all requests waiting at t = 0;
workload.py) in a fixed KV budget of 65,536 token slots against (a) contiguous
reservation of the maximum model length (2,048) per request, (b) reservation of the next power
of two at or above prompt + output length (both simulated with the engine's iteration
structure, reservation.py), and (c) pagedserve's engine and allocator core at block
sizes 8 to 256 (paged.py). After every iteration it samples the sequences holding KV
memory, the tokens they hold and the slots allocated to them (samples.py). Reported:
the share of allocated slots holding tokens and the mean and max concurrent sequences while
requests wait (targets: ≥ 96% at block 16, and ≥ 3× the sequences of (a)), and the same over
the whole run. Writes the `## Memory` section of docs/benchmarks.md (report.py) and
docs/img/memory_bench.png (plot.py); `--results-dir` also keeps the raw numbers as
memory_bench.json. Exits 1 when a sanity check fails (a request without all its tokens, or a
sample the admin API's pool statistics disagree with).

Where this departs from its brief, and why: the paged runs' forward pass is a stand-in
(paged.py), not a tiny random Llama checkpoint. A CPU forward pass over a full
65,536-slot cache took about 0.1 s per iteration (the paged decode attention reads every cached
token), so minutes per block size, and the kernels refuse block size 8; the tokens computed
change nothing in where memory goes, and tests/bench/test_bench_memory.py pins that a real model's
engine yields the very same samples.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench.memory import report
from bench.memory.paged import replay_paged, stand_in_engine
from bench.memory.plot import write_plot
from bench.memory.reservation import (max_length_reservation, power_of_two_reservation,
                                      replay_reservations)
from bench.memory.samples import CONTIGUOUS, POW2, SchemeRun
from bench.memory.workload import FULL, QUICK, Settings, Workload, draw_workload
from bench.report import (add_output_flags, output_paths, publish, text_grid, text_table,
                          with_overrides)

SANITY_FAILED_EXIT = 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.memory",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--requests", type=int, default=None,
                        help="number of requests (default: 800; 100 with --quick)")
    parser.add_argument("--budget-slots", type=int, default=None,
                        help="KV budget of every scheme, in token slots (default: 65536; "
                             "1024 with --quick)")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=None,
                        help="block sizes of the paged runs (default: 8 16 32 64 128 256; "
                             "16 64 with --quick); 16 carries the targets")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also write the raw results there as memory_bench.json")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    settings = QUICK if args.quick else FULL
    settings = with_overrides(
        settings, num_requests=args.requests, budget_slots=args.budget_slots,
        block_sizes=None if args.block_sizes is None else tuple(args.block_sizes))
    # The targets are read at the headline block size, so it always runs; smallest first.
    block_sizes = sorted({settings.headline_block_size, *settings.block_sizes})
    return dataclasses.replace(settings, block_sizes=tuple(block_sizes))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    out_md, out_png = output_paths(args, "memory_bench.png")
    started = time.perf_counter()
    workload = draw_workload(settings)
    results = report.Results(settings, workload, measure(settings, workload))

    print(text_grid(*report.scheme_grid(results)))
    print()
    print(text_table(report.result_rows(results)))
    print()
    print("\n".join(report.target_lines(results)))
    print(f"measured in {time.perf_counter() - started:.0f} s")
    publish("Memory", results, report, write_plot, args.results_dir, out_png, out_md)
    if not report.sane(results):
        print("a sanity check failed (see the table)", file=sys.stderr)
        return SANITY_FAILED_EXIT
    return 0


def measure(settings: Settings, workload: Workload) -> list[SchemeRun]:
    """Every scheme over the same requests: the two reservations, then paged by block size."""
    n = settings.num_requests
    reservations = [
        (CONTIGUOUS, "contiguous, max-length reservation",
         max_length_reservation(settings.max_model_len)),
        (POW2, "contiguous, power-of-two reservation", power_of_two_reservation),
    ]
    runs = []
    for name, label, reserve in reservations:
        with progress_bar(n, label) as progress:
            runs.append(replay_reservations(name, label, workload.prompt_lens,
                                            workload.output_lens, reserve,
                                            settings.budget_slots, settings.max_batched_tokens,
                                            progress))
    for block_size in settings.block_sizes:
        label = f"pagedserve, block {block_size}"
        with progress_bar(n, label) as progress:
            runs.append(replay_paged(stand_in_engine(settings, block_size), workload, label,
                                     progress))
    return runs


def progress_bar(total: int, label: str) -> tqdm:
    return tqdm(total=total, unit="req", leave=False, file=sys.stderr, desc=label)


if __name__ == "__main__":
    sys.exit(main())
