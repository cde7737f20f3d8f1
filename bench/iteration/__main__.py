"""Iteration benchmark: where one engine iteration's time goes at steady decode, phase by phase
(plan, Step, mirroring the answer, input preparation, forward, sampling, output handling), for
decode batches of 1, 16, 64 and 256 sequences on the embedded model, each contender (an engine
configuration) side by side.

    .venv/bin/python -m bench.iteration                      # CPU, embedded model
    .venv/bin/python -m bench.iteration --quick              # smoke run; writes nothing unless told
    .venv/bin/python -m bench.iteration --contenders sparse  # only some contenders

Each run submits a batch of short prompts (uniform in [16, 32] tokens) to an in-process engine,
greedy with end-of-sequence ignored, steps until every sequence decodes, runs a few untimed
iterations, then times each of the next ones, cut into phases by wrappers put on the engine's
instances (probe.py says which calls and how the time between them is assigned); the engine's
code is not changed. Contenders are EngineOptions overrides (workload.CONTENDERS); each has its
own engine, built once, and every contender runs every batch size once per round, the order
rotating. Reported per batch size and contender: median and mean ms per iteration of each phase,
the total, the host time outside the forward pass, allocator ops and Steps per iteration, and
the others' medians over the first contender's. Writes the `## Iteration` section of
docs/benchmarks.md (report.py) and docs/img/iteration_bench.png (plot.py); `--results-dir` also
keeps every timed iteration as iteration_bench.json.

torch computes on one thread unless --threads says otherwise, as in bench.sharing: on a busy
shared machine OpenMP threads spinning for each other make per-iteration times noise.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.iteration import report
from bench.iteration.plot import write_plot
from bench.iteration.run import measure_batch
from bench.iteration.workload import (CONTENDERS, FULL, QUICK, Settings, draw_prompts,
                                      engine_options)
from bench.report import add_output_flags, output_paths, publish, text_grid, text_table, \
    with_overrides
from bench.throughput.workload import ordinary_token_ids
from executor_service.engine.build import build_engine
from executor_service.engine.engine import Engine
from executor_service.heap import settle_startup_heap
from executor_service.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir
from pagedserve.protocol.sampling_params import SamplingParams

SANITY_FAILED_EXIT = 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.iteration",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--contenders", nargs="+", choices=list(CONTENDERS),
                        default=list(CONTENDERS), metavar="LABEL",
                        help="engine configurations to compare, the first the reference "
                             f"(default: all of {', '.join(map(repr, CONTENDERS))})")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                        help="decoding sequences per iteration (default: 1 16 64 256; "
                             "1 4 with --quick)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed decode iterations per run (default: 50; 5 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs of every contender at every batch size, the order rotating "
                             "(default: 3; 1 with --quick)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 0: torch's default, one per core (default: 1)")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also write every timed iteration there as iteration_bench.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = with_overrides(
        QUICK if args.quick else FULL, iterations=args.iterations, rounds=args.rounds,
        batch_sizes=None if args.batch_sizes is None else tuple(args.batch_sizes))
    if args.threads:
        torch.set_num_threads(args.threads)
    contenders = {label: CONTENDERS[label] for label in dict.fromkeys(args.contenders)}
    out_md, out_png = output_paths(args, "iteration_bench.png")
    results = measure(settings, contenders)

    print(text_grid(*report.summary_grid(results)))
    for batch in settings.batch_sizes:
        print(f"\nbatch {batch}:")
        print(text_grid(*report.batch_grid(results, batch)))
    print()
    print(text_table(report.sanity_rows(results)))
    publish("Iteration", results, report, write_plot, args.results_dir, out_png, out_md)
    if report.failed(results):
        print("a sanity check failed (see the rows marked NO)", file=sys.stderr)
        return SANITY_FAILED_EXIT
    return 0


def warm_up(engine: Engine, token_ids: list[int]) -> None:
    """A few short requests to completion, untimed: first calls, lazily faulted memory."""
    prompts = draw_prompts(QUICK, 4, token_ids)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"warmup-{index}", prompt, params, cache_salt="warmup")
    while engine.has_work():
        engine.step()


def measure(settings: Settings, contenders: dict[str, dict]) -> report.Results:
    model_dir = embedded_model_dir()
    token_ids = ordinary_token_ids(model_dir)
    engines = {label: build_engine(model_dir, engine_options(overrides), LocalBlockAllocator())
               for label, overrides in contenders.items()}
    for engine in engines.values():
        warm_up(engine, token_ids)
    # As the executor process does once its engine is built (executor_service/heap.py): no
    # full collection pauses a timed iteration (the executor's, once a minute, is left out).
    settle_startup_heap()
    results = report.Results(settings, f"{EMBEDDED_MODEL_NAME} (the embedded default)",
                             torch.get_num_threads(), contenders)
    labels = list(contenders)
    total = settings.rounds * len(settings.batch_sizes) * len(labels)
    with tqdm(total=total, unit="run", leave=False, file=sys.stderr) as progress:
        for round_index in range(settings.rounds):
            for batch_index, batch in enumerate(settings.batch_sizes):
                prompts = draw_prompts(settings, batch, token_ids)
                # Rotating the order spreads a shared machine's slow phases over all contenders.
                shift = (round_index + batch_index) % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    progress.set_description(f"round {round_index + 1}/{settings.rounds}: "
                                             f"batch {batch}, {label}")
                    run = measure_batch(engines[label], prompts, settings,
                                        f"r{round_index}-b{batch}")
                    results.runs.setdefault((batch, label), []).append(run)
                    progress.update()
    return results


if __name__ == "__main__":
    sys.exit(main())
