"""Beam-search benchmark: the KV blocks copy-on-write sharing saves a beam search, and its
throughput against transformers' beam search and vLLM's (its CPU build, through its OpenAI API),
on the same requests, in one run.

    .venv/bin/python -m bench.beam            # widths 2, 4, 8; both workloads (make bench-beam)
    .venv/bin/python -m bench.beam --quick    # smoke run (about a minute); writes nothing unless told

Blocks (memory.py): each width's requests run one at a time in an in-process engine, and after
every iteration the blocks the allocator holds for the request's beams are counted, shared and
as if every beam had a copy of its history. Throughput (contenders.py): per workload, pagedserve
(`pagedserve up`) and `vllm serve` stay up on free loopback ports and transformers is loaded in
this process; each round sends every width's requests to each contender, the order of the
contenders alternating from round to round, each round with prompts of its own. Workloads:
`embedded` (pagedserve's embedded default, 3M parameters: overhead dominates) and `mid` (the
peer benchmark's 64M-parameter Llama, bench/peers/checkpoint.py: the matmuls dominate).

Writes the `## Beam search` section of docs/benchmarks.md (report.py) and
docs/img/beam_bench.png (plot.py); `--results-dir` also keeps beam_bench.json and the vLLM log.
Not part of `make bench` or `make test`: `make bench-beam`. The peer is installed on first use
into `.venv-peer/` (bench/peers/install.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.beam import memory
from bench.beam import report as beam_report
from bench.beam.contenders import (CONTENDERS, HF_BATCHED, HF_SEQUENTIAL, PAGEDSERVE, VLLM, Timing,
                                   Transformers, Workload, over_http)
from bench.beam.plot import write_plot
from bench.beam.report import Blocks, Results, Run, Settings
from bench.peers import install
from bench.peers.stacks import PagedserveServer, ServerSettings, VllmServer
from bench.peers.workloads import WORKLOADS, parse_workloads, workload_model
from bench.report import add_output_flags, output_paths, publish, with_overrides
from bench.throughput.workload import ordinary_token_ids
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.model.embedded import embedded_model_dir

MEMORY_BLOCK_SIZE = 16
SEED = 20261125


@dataclass(frozen=True, slots=True)
class Preset:
    widths: tuple[int, ...]
    num_requests: int
    prompt_len: int
    output_len: int
    rounds: int
    workloads: tuple[str, ...]
    memory_prompts: int


FULL = Preset(widths=(2, 4, 8), num_requests=8, prompt_len=512, output_len=128, rounds=2,
              workloads=WORKLOADS, memory_prompts=4)
QUICK = Preset(widths=(2, 4), num_requests=2, prompt_len=64, output_len=16, rounds=1,
               workloads=("embedded",), memory_prompts=1)


def parse_widths(text: str) -> tuple[int, ...]:
    """A comma-separated --widths value, as an argparse type."""
    try:
        widths = tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"widths are positive integers, comma-separated; got "
                                         f"{text!r}")
    return widths


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.beam",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--widths", type=parse_widths, default=None,
                        help="beam widths (default 2,4,8)")
    parser.add_argument("--workloads", type=parse_workloads, default=None,
                        help="comma-separated, of: embedded, mid (default: both)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per width, sent at once (default 8)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (512)")
    parser.add_argument("--output-len", type=int, default=None,
                        help="output tokens per hypothesis (128)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs per contender and width, alternating (default 2)")
    parser.add_argument("--memory-prompts", type=int, default=None,
                        help="requests per width whose blocks are counted (default 4)")
    parser.add_argument("--peer-venv", type=Path, default=install.DEFAULT_VENV,
                        help="where the peer is installed (default .venv-peer/)")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also keep beam_bench.json and the vLLM log there")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset = with_overrides(QUICK if args.quick else FULL, widths=args.widths,
                            workloads=args.workloads, num_requests=args.requests,
                            prompt_len=args.prompt_len, output_len=args.output_len,
                            rounds=args.rounds, memory_prompts=args.memory_prompts)
    venv = install.install(args.peer_venv)
    out_md, out_png = output_paths(args, "beam_bench.png")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    base = ServerSettings(Path("."), "")
    server = {key: value for key, value in dataclasses.asdict(base).items()
              if key not in ("model_dir", "served_name", "startup_timeout_s")}
    settings = Settings(preset.widths, preset.num_requests, preset.prompt_len,
                        preset.output_len, preset.rounds, preset.memory_prompts,
                        MEMORY_BLOCK_SIZE, server)
    vllm_version = json.loads((venv / install.MARKER).read_text())["vllm"]
    results = Results(settings, vllm_version, {}, quick=args.quick)
    total = (len(preset.widths)
             + len(preset.workloads) * preset.rounds * len(preset.widths) * len(CONTENDERS))
    with tempfile.TemporaryDirectory(prefix="pagedserve-beam-") as scratch, \
            tqdm(total=total, unit="run", file=sys.stderr, desc="beam") as progress:
        work = args.results_dir or Path(scratch)
        results.blocks = count_blocks(preset, progress)
        for name in preset.workloads:
            measure_workload(name, preset, base, venv, work, results, progress)
    print(beam_report.terminal_text(results))
    publish("Beam search", results, beam_report, write_plot, args.results_dir, out_png, out_md)
    return 0


def prompts_for(model_dir: Path, count: int, length: int, seed: int) -> list[list[int]]:
    ids = ordinary_token_ids(model_dir)
    rng = random.Random(seed)
    return [[rng.choice(ids) for _ in range(length)] for _ in range(count)]


def count_blocks(preset: Preset, progress: tqdm) -> list[Blocks]:
    model_dir = embedded_model_dir()
    per_width = preset.prompt_len + preset.output_len
    num_blocks = 2 * max(preset.widths) * (per_width // MEMORY_BLOCK_SIZE + 8)
    engine = build_engine(model_dir, EngineOptions(num_blocks=num_blocks,
                                                   block_size=MEMORY_BLOCK_SIZE),
                          LocalBlockAllocator())
    blocks = []
    for width in preset.widths:
        progress.set_description(f"blocks: width {width}")
        samples = []
        for index, prompt in enumerate(prompts_for(model_dir, preset.memory_prompts,
                                                   preset.prompt_len, SEED + width)):
            samples += memory.count_blocks(engine, f"k{width}-{index}", prompt, width,
                                           preset.output_len)
        blocks.append(Blocks.from_samples(width, samples))
        progress.update()
    return blocks


def measure_workload(name: str, preset: Preset, base: ServerSettings, venv: Path, work: Path,
                     results: Results, progress: tqdm) -> None:
    model_dir, model = workload_model(name)
    results.workloads[name] = model
    settings = dataclasses.replace(base, model_dir=model_dir, served_name=f"beam-{name}")
    progress.set_description(f"{name}: starting pagedserve")
    with PagedserveServer(settings) as ours:
        progress.set_description(f"{name}: starting vLLM (compiles the model)")
        with VllmServer(settings, venv, work / f"{name}-vllm-serve.log") as theirs:
            progress.set_description(f"{name}: loading transformers")
            hf = Transformers(model_dir)
            runners = {PAGEDSERVE: lambda w: over_http(ours.base_url, settings.served_name, w),
                       VLLM: lambda w: over_http(theirs.base_url, settings.served_name, w),
                       HF_BATCHED: hf.batched, HF_SEQUENTIAL: hf.one_by_one}
            warm = Workload(prompts_for(model_dir, 2, preset.prompt_len, SEED), 2, 4)
            for runner in runners.values():
                runner(warm)
            for round_index in range(preset.rounds):
                order = CONTENDERS if round_index % 2 == 0 else CONTENDERS[::-1]
                for width in preset.widths:
                    workload = Workload(prompts_for(model_dir, preset.num_requests,
                                                    preset.prompt_len,
                                                    SEED + 1000 * round_index + width),
                                        width, preset.output_len)
                    for position, contender in enumerate(order):
                        progress.set_description(f"{name}: round {round_index + 1}, k={width}, "
                                                 f"{contender}")
                        timing: Timing = runners[contender](workload)
                        if timing.output_tokens != workload.expected_tokens:
                            raise RuntimeError(f"{contender} returned {timing.output_tokens} "
                                               f"tokens, not {workload.expected_tokens}")
                        results.runs.append(Run(name, width, contender, round_index, position,
                                                timing.wall_s, timing.output_tokens))
                        progress.update()


if __name__ == "__main__":
    sys.exit(main())
