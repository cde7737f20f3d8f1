"""Sharing benchmark: the KV blocks our engine saves by sharing them, and what it does to
throughput. Parallel sampling with n = 2, 4, 6 (fork) and one system prompt shared by many
requests (prefix cache), each run with and without sharing on the same requests.

    .venv/bin/python -m bench.sharing            # CPU, embedded model (about 1.5 minutes)
    .venv/bin/python -m bench.sharing --quick    # smoke run (seconds); writes nothing unless told

Each case submits its requests at once to our engine (in-process, a cache large enough that
nothing is preempted) and counts the blocks in use after every iteration (run.py);
workload.py says what "shared" and "not shared" submit. Reported per case: blocks in
use (mean over the run, time-weighted, and peak) with and without sharing and the saving,
the saving the lengths predict, prompt tokens computed, output tokens/s of both modes and their
ratio; beside them the vLLM paper's savings (6–30% for parallel sampling, 37–66% for beam
search, which bench/beam measures) for reference, not as targets (docs/benchmarks.md says why ours
differ). Sanity rows: every request returned all its tokens, nothing was preempted, and greedy
outputs are the same with and without the prefix cache; if one fails the script exits 1.
Writes the `## Sharing` section of docs/benchmarks.md (report.py) and
docs/img/sharing_bench.png (plot.py); `--results-dir` also keeps the raw numbers as
sharing_bench.json.

Design notes. torch computes on one thread unless --threads says otherwise: what this
benchmark times is a ratio of two modes, and on a busy 2-core machine two OpenMP threads that
spin waiting for each other made runs up to ten times slower, at random (the full run took
9 min 49 s instead of 1 min 19 s and its ratios were noise; --quick 40 s instead of 3-5 s).
The mean is time-weighted, block-seconds over seconds, since that is the memory sharing frees
for other requests; the per-iteration mean (no timing in it) is in the JSON too. Both modes of
a case run in one engine, one after the other, alternating which goes first, with the prefix
cache emptied before each run and salts of its own, so neither finds the other's blocks.
--quick allows 64 tokens per iteration, not 2,048, so its 4 system prompt requests are
admitted one by one and the later ones do find the system prompt cached.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.report import add_output_flags, output_paths, publish, text_grid, text_table
from bench.sharing import report
from bench.sharing.plot import write_plot
from bench.sharing.run import run_case
from bench.sharing.workload import FULL, QUICK, Settings, Submission, draw_cases
from bench.throughput.workload import ordinary_token_ids, warmup_workload
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.engine import Engine
from executor_service.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir
from pagedserve.protocol.sampling_params import SamplingParams

SANITY_FAILED_EXIT = 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sharing",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs of each mode of each case, alternating; the fastest counts "
                             "(default: 2, 1 with --quick)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 0: torch's default, one per core "
                             "(default: 1)")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also write the raw results there as sharing_bench.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.rounds is not None:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    if args.threads:
        torch.set_num_threads(args.threads)
    out_md, out_png = output_paths(args, "sharing_bench.png")
    results = measure(settings)

    print(text_grid(*report.case_grid(results)))
    print()
    print(text_table(report.result_rows(results)))
    publish("Sharing", results, report, write_plot, args.results_dir, out_png, out_md)
    if report.failed(results):
        print("a sanity check failed (see the rows marked NO)", file=sys.stderr)
        return SANITY_FAILED_EXIT
    return 0


def build(settings: Settings, model_dir: Path) -> Engine:
    return build_engine(model_dir, EngineOptions(
        device="cpu", dtype="float32", block_size=16, num_blocks=settings.num_blocks,
        max_num_batched_tokens=settings.max_batched_tokens), LocalBlockAllocator())


def warmup(token_ids: list[int]) -> list[Submission]:
    """A few short requests, greedy and n = 2, run untimed first: first calls, lazily faulted
    memory, the fork and copy-on-write paths."""
    prompts = warmup_workload(token_ids).prompts
    return [Submission(prompt, SamplingParams(n=1 + i % 2, temperature=i % 2, seed=i,
                                              max_tokens=4, ignore_eos=True), "warmup")
            for i, prompt in enumerate(prompts)]


def measure(settings: Settings) -> report.Results:
    model_dir = embedded_model_dir()
    token_ids = ordinary_token_ids(model_dir)
    cases = draw_cases(settings, token_ids)
    engine = build(settings, model_dir)
    results = report.Results(settings, f"{EMBEDDED_MODEL_NAME} (the embedded default)",
                             settings.num_blocks, torch.get_num_threads(),
                             [report.Pair(case) for case in cases])
    run_case(engine, warmup(token_ids), "warmup")
    total = settings.rounds * sum(len(case.submissions(shared, ""))
                                  for case in cases for shared in (False, True))
    with tqdm(total=total, unit="req", leave=False, file=sys.stderr) as progress:
        for round_index in range(settings.rounds):
            for case_index, pair in enumerate(results.pairs):
                # Alternating which mode goes first spreads a shared machine's slow phases.
                modes = (False, True) if (round_index + case_index) % 2 == 0 else (True, False)
                for shared in modes:
                    mode = "shared" if shared else "not shared"
                    tag = f"r{round_index}-c{case_index}-{'s' if shared else 'u'}"
                    progress.set_description(f"round {round_index + 1}/{settings.rounds}: "
                                             f"{pair.case.label}, {mode}")
                    run = run_case(engine, pair.case.submissions(shared, tag), tag, progress)
                    (pair.shared if shared else pair.unshared).append(run)
    return results


if __name__ == "__main__":
    sys.exit(main())
