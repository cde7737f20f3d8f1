"""Serving benchmark: the whole stack (allocator, executor, gateway as processes) through gRPC
and HTTP against the in-process engine, on the same requests at the same request rates, as
vLLM's `benchmark_serving` measures a server.

    .venv/bin/python -m bench.serve            # CPU, embedded model (about 4 minutes)
    .venv/bin/python -m bench.serve --quick    # smoke run; writes nothing unless told
    .venv/bin/python -m bench.serve --gpu      # executor and in-process engine on CUDA

The CPU preset sends 192 requests with chat-like prompt lengths and 32..128 output tokens at
request rates ∞, 12 and 6 per second, at most 64 open at a time, to each contender: the
in-process engine (engine_load.py), the gateway's gRPC `Generate` and its OpenAI HTTP
`/v1/completions` with streaming (gateway_load.py), the stack started as child processes
on loopback (stack.py). Measured per contender and rate: request throughput, output
tokens/s, TTFT, TPOT and ITL (mean, median, p99; metrics.py says how), and the CPU each
process spent per token. Target: the stack through gRPC delivers ≥ 80 % of the in-process
engine's output tokens/s at 64 concurrent streams (rate ∞); HTTP's ratio is reported beside it.
Sanity, which makes the exit status 1 when it fails: every request returned exactly its tokens,
gRPC's greedy tokens equal the in-process engine's, HTTP's text equals gRPC's.

Writes the `## Serving` section of docs/benchmarks.md (report.py) and
docs/img/serve_bench.png (plot.py); `--results-dir` also keeps serve_bench.json.

Decisions:
- The load generator is this process, on the same cores as the stack (there is no second
  machine); its CPU per token is reported, so its share is visible.
- Only rate ∞, where the target is judged, repeats (--rounds, the best counting); each finite
  rate runs once per contender, which keeps the run within minutes.
- The gRPC client is grpc.aio, not the project's synchronous `GatewayClient` on threads: on
  the shared cores the load generator should steal as little as it can, and the threads cost
  about 1.4× the CPU per token (gateway_load.py). The HTTP client is httpx's AsyncClient.
- The in-process engine runs on this process's main thread, where the throughput benchmark
  runs it too; no other thread here runs torch (engine_load.py says why that matters).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from bench.report import (add_output_flags, output_paths, publish, refused, text_grid, text_table,
                          with_overrides)
from bench.serve import report
from bench.serve.engine_load import InProcessLoad
from bench.serve.gateway_load import GrpcLoad, HttpLoad
from bench.serve.metrics import Run
from bench.serve.model import ServedModel, model_for
from bench.serve.plot import write_plot
from bench.serve.stack import Stack, cpu_seconds, executor_flags
from bench.serve.workload import (CPU, GPU, QUICK, GiB, ServeSettings, arrival_times, draw_requests,
                                  parse_rates, rate_label)
from bench.throughput.workload import Workload, fixed, ordinary_token_ids, warmup_workload

NO_GPU_EXIT = 2
SANITY_FAILED_EXIT = 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.serve",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU preset: executor and in-process engine on cuda, bfloat16")
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint directory (default: the embedded model; with --gpu a "
                             "random-weight model of Qwen2.5-0.5B's shape)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the preset's)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--requests", type=int, default=None, help="requests per run")
    parser.add_argument("--output-len", type=int, default=None,
                        help="output tokens of every request (default: the preset's lengths)")
    parser.add_argument("--rates", type=parse_rates, default=None,
                        help="request rates per second, comma-separated, inf for all at once "
                             "(default: the preset's, e.g. inf,8,4)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="requests open at once at most (default 64)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs of each contender at rate inf (else the highest rate), "
                             "interleaved, the best counting; other rates run once")
    parser.add_argument("--kv-cache-gib", type=float, default=None,
                        help="KV cache of each engine (default: the preset's)")
    parser.add_argument("--max-batched-tokens", type=int, default=None,
                        help="tokens per iteration at most, both engines")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also write the raw results there as serve_bench.json")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> ServeSettings:
    settings = GPU if args.gpu else QUICK if args.quick else CPU
    if args.gpu and args.quick:
        # A smoke run of the GPU path: its device and dtype, the quick run's sizes.
        settings = dataclasses.replace(
            QUICK, name="gpu-quick", device=GPU.device, dtype=GPU.dtype,
            kv_cache_bytes=GPU.kv_cache_bytes)
    return with_overrides(
        settings, device=args.device, dtype=args.dtype, num_requests=args.requests,
        output_lens=None if args.output_len is None else fixed(args.output_len),
        request_rates=args.rates, max_concurrency=args.max_concurrency,
        rounds=args.rounds,
        kv_cache_bytes=None if args.kv_cache_gib is None else int(args.kv_cache_gib * GiB),
        max_batched_tokens=args.max_batched_tokens)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    if refused("bench.serve", settings.device):
        return NO_GPU_EXIT
    out_md, out_png = output_paths(args, "serve_bench.png")
    # SIGTERM unwinds like Ctrl-C, so the stack is always stopped in order.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with tempfile.TemporaryDirectory(prefix="pagedserve-serve-") as scratch:
        results = measure(settings, model_for(args.model, args.gpu, Path(scratch)))

    print(text_grid(*report.throughput_grid(results)))
    print()
    print(text_grid(*report.latency_grid(results)))
    print()
    print(text_grid(*report.cpu_grid(results)))
    print()
    print(text_table(report.result_rows(results)))
    print()
    print("\n".join(report.target_lines(results)))
    publish("Serving", results, report, write_plot, args.results_dir, out_png, out_md)
    failed = report.failed_checks(results)
    for row in failed:
        print(f"SANITY CHECK FAILED: {row.metric}: {row.measured} (expected {row.target})",
              file=sys.stderr)
    return SANITY_FAILED_EXIT if failed else 0


def measure(settings: ServeSettings, model: ServedModel) -> report.Results:
    token_ids = ordinary_token_ids(model.directory)
    workload, warmup = draw_requests(settings, token_ids), warmup_workload(token_ids)
    device = torch.cuda.get_device_name() if settings.device.startswith("cuda") else "cpu"
    results = report.Results(settings, workload, model.name, device)
    in_process = InProcessLoad(settings, model.directory)
    with Stack(executor_flags(settings, model.executor_model)) as stack:
        print(f"stack up: gateway {stack.grpc_target} (gRPC), {stack.http_url} (HTTP); "
              f"{stack.describe()}", file=sys.stderr)
        loads = {report.ENGINE: in_process,
                 report.GRPC: GrpcLoad(stack.grpc_target, settings.max_concurrency),
                 report.HTTP: HttpLoad(stack.http_url, settings.max_concurrency)}
        try:
            for name, load in loads.items():
                load.serve(warmup, [0.0] * len(warmup.prompts), f"warmup-{name}")
            processes = {report.PROCESSES[0]: os.getpid(), **stack.pids}
            for round_index in range(settings.rounds):
                for rate_index, rate in enumerate(settings.request_rates):
                    if round_index < settings.rounds_at(rate):
                        results.runs += run_rate(settings, workload, loads, processes, rate,
                                                 round_index, rate_index)
        finally:
            for load in loads.values():
                load.close()
    results.align_http_runs()
    return results


def run_rate(settings: ServeSettings, workload: Workload, loads: dict,
             processes: dict[str, int], rate: float, round_index: int, rate_index: int
             ) -> list[Run]:
    """Every contender once at `rate`; the order rotates, spreading a shared machine's slow
    phases over all of them."""
    arrivals = arrival_times(len(workload.prompts), rate)
    names = list(loads)
    shift = (round_index + rate_index) % len(names)
    runs = []
    for name in names[shift:] + names[:shift]:
        salt = f"{name}-rate-{rate_label(rate)}-round-{round_index}"
        desc = (f"round {round_index + 1}/{settings.rounds_at(rate)}, rate {rate_label(rate)}: "
                f"{report.LABELS[name]}")
        with tqdm(total=len(workload.prompts), unit="req", leave=False, file=sys.stderr,
                  desc=desc) as progress:
            before = cpu_snapshot(processes)
            traces, start, end = loads[name].serve(workload, arrivals, salt, progress)
            after = cpu_snapshot(processes)
        cpu = {process: after[process] - before[process] for process in before
               if before[process] is not None and after[process] is not None}
        runs.append(Run(name, rate, round_index, start, end, traces, cpu))
    return runs


def cpu_snapshot(processes: dict[str, int]) -> dict[str, float | None]:
    return {name: cpu_seconds(pid) for name, pid in processes.items()}


if __name__ == "__main__":
    sys.exit(main())
