"""Throughput benchmark: our engine against transformers' static `generate` and its
`generate_batch`, on the same model and the same mixed-length requests, in one run.

    .venv/bin/python -m bench.throughput            # CPU, embedded model (about 2 minutes)
    .venv/bin/python -m bench.throughput --quick    # smoke run; writes nothing unless told
    .venv/bin/python -m bench.throughput --gpu      # the issue's GPU workload (needs CUDA)

The CPU preset serves 128 requests with chat-like prompt lengths (log-normal, median 100
tokens, clipped to [8, 1024]; workload.py says why) and 64 output tokens each,
end-of-sequence ignored, in float32 on the embedded default model. --gpu serves 256 requests
whose prompt and output lengths are uniform in [100, 1024], in bfloat16, on a random-weight
model of Qwen2.5-0.5B's shape unless --model names a checkpoint. Each contender is greedy and
gets the same requests (contenders.py); every run is timed from the first request in
to the last token out, and the contenders take turns, the best of --rounds counting. Reported:
output tokens/s, ours over each of the others (targets: ≥ 1.5× static and ≥ 5× generate_batch on
the CPU preset, ≥ 10× and ≥ 2× on --gpu), our allocator stalls, and whether the others' greedy
tokens equal ours. Writes the `## Throughput` section of docs/benchmarks.md
(report.py) and docs/img/throughput_bench.png (plot.py); `--results-dir`
also keeps the raw numbers as throughput_bench.json.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from bench.report import (add_output_flags, output_paths, publish, refused, text_grid, text_table,
                          with_overrides)
from bench.throughput import report
from bench.throughput.contenders import (CONTINUOUS, OURS, STATIC, build_ours, cache_tokens,
                                         continuous_config, load_transformers, run_continuous,
                                         run_ours, run_static)
from bench.throughput.plot import write_plot
from bench.throughput.workload import (CPU, GPU, QUICK, GiB, Settings, draw_workload, fixed,
                                       ordinary_token_ids, warmup_workload, write_gpu_stand_in)
from executor_service.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir

NO_GPU_EXIT = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU workload: 256 requests, prompts and outputs uniform in "
                             "[100, 1024], bfloat16 on cuda")
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint directory (default: the embedded model; with --gpu a "
                             "random-weight model of Qwen2.5-0.5B's shape)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the preset's)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--requests", type=int, default=None, help="number of requests")
    parser.add_argument("--output-len", type=int, default=None,
                        help="output tokens of every request (default: the preset's)")
    parser.add_argument("--hf-batch", type=int, default=None,
                        help="requests per padded batch of transformers' static generate")
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs of each contender, interleaved; the best counts")
    parser.add_argument("--kv-cache-gib", type=float, default=None,
                        help="KV cache of ours and of generate_batch (default: the preset's)")
    parser.add_argument("--max-batched-tokens", type=int, default=None,
                        help="tokens per forward pass at most, ours and generate_batch")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also write the raw results there as throughput_bench.json")
    parser.add_argument("--profile", action="store_true",
                        help="afterwards, print cProfile's hottest functions of one more run of "
                             "our engine (not timed, not written)")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    settings = GPU if args.gpu else QUICK if args.quick else CPU
    if args.gpu and args.quick:
        # A smoke run of the GPU path: its device and dtype, the quick run's sizes.
        settings = dataclasses.replace(
            settings, num_requests=QUICK.num_requests, prompt_lens=QUICK.prompt_lens,
            output_lens=QUICK.output_lens, hf_batch=QUICK.hf_batch, rounds=QUICK.rounds)
    return with_overrides(
        settings, device=args.device, dtype=args.dtype, num_requests=args.requests,
        output_lens=None if args.output_len is None else fixed(args.output_len),
        hf_batch=args.hf_batch, rounds=args.rounds,
        kv_cache_bytes=None if args.kv_cache_gib is None else int(args.kv_cache_gib * GiB),
        max_batched_tokens=args.max_batched_tokens)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    if refused("bench.throughput", settings.device):
        return NO_GPU_EXIT
    out_md, out_png = output_paths(args, "throughput_bench.png")
    with tempfile.TemporaryDirectory(prefix="pagedserve-throughput-") as scratch:
        model_dir, model_name = model_for(args, Path(scratch))
        results, profile = measure(settings, model_dir, model_name, args.profile)

    print(text_grid(*report.contender_grid(results)))
    print()
    print(text_table(report.result_rows(results)))
    print()
    print("\n".join(report.target_lines(results) + report.mismatch_lines(results)))
    if profile:
        print(f"\nour engine, one more run under cProfile:\n{profile}")
    publish("Throughput", results, report, write_plot, args.results_dir, out_png, out_md)
    return 0


def model_for(args: argparse.Namespace, scratch: Path) -> tuple[Path, str]:
    if args.model is not None:
        return args.model, args.model.name
    if args.gpu:
        print("writing a random-weight model of Qwen2.5-0.5B's shape ...", file=sys.stderr)
        return write_gpu_stand_in(scratch / "qwen2.5-0.5b-shape"), \
            "Qwen2.5-0.5B's shape, random weights"
    return embedded_model_dir(), f"{EMBEDDED_MODEL_NAME} (the embedded default)"


def measure(settings: Settings, model_dir: Path, model_name: str, profile: bool
            ) -> tuple[report.Results, str]:
    token_ids = ordinary_token_ids(model_dir)
    workload, warmup = draw_workload(settings, token_ids), warmup_workload(token_ids)
    device = (torch.cuda.get_device_name() if settings.device.startswith("cuda")
              else "cpu")
    engine = build_ours(settings, model_dir)
    static_model = load_transformers(model_dir, settings)
    continuous_model = load_transformers(model_dir, settings)
    results = report.Results(settings, workload, model_name, device, cache_tokens(engine))
    cb_config = continuous_config(settings, results.cache_tokens)
    run_ours(engine, warmup, settings.device, cache_salt="warmup")
    run_static(static_model, warmup, settings.hf_batch, settings.device)

    runners = {
        OURS: lambda progress, round_index: run_ours(
            engine, workload, settings.device, f"round-{round_index}", progress),
        STATIC: lambda progress, _: run_static(
            static_model, workload, settings.hf_batch, settings.device, progress),
        CONTINUOUS: lambda progress, _: run_continuous(
            continuous_model, workload, warmup, cb_config, settings.device, progress),
    }
    order = list(runners)
    for round_index in range(settings.rounds):
        # Rotating the order spreads slow phases of a shared machine over all contenders.
        for name in order[round_index % 3:] + order[:round_index % 3]:
            with tqdm(total=len(workload.prompts), unit="req", leave=False, file=sys.stderr,
                      desc=f"round {round_index + 1}/{settings.rounds}: {report.LABELS[name]}"
                      ) as progress:
                results.rounds[name].append(runners[name](progress, round_index))
    if not profile:
        return results, ""
    profiler, text = cProfile.Profile(), io.StringIO()
    profiler.runcall(run_ours, engine, workload, settings.device, "profile")
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    return results, text.getvalue()


if __name__ == "__main__":
    sys.exit(main())
