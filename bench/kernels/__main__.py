"""Kernels benchmark: paged-attention Triton kernels vs copy bandwidth and vs PyTorch SDPA.

Measures the kernels against the machine's copy bandwidth and against SDPA on contiguous K/V of
the same shapes. Needs a CUDA GPU; on a GPU machine this is the one command to run (or
`make bench-kernels`):

    .venv/bin/python -m bench.kernels            # full sweep (several minutes)
    .venv/bin/python -m bench.kernels --quick    # smoke run, also on a CPU; writes nothing
                                                       # unless told
    .venv/bin/python -m bench.kernels --targets  # the target points only (GPU, a minute);
                                                       # writes nothing unless told

First the copy bandwidth (`dst.copy_(src)`, bytes read + written); then decode over block sizes
16..256 × contexts 512..16k × batches 1..256 with Llama-3-8B attention shapes (32 query heads,
8 kv heads, head dim 128, bf16): the paged kernel's time, its achieved bandwidth (K/V, queries
and outputs over its time) and its time relative to SDPA; then causal prefill against SDPA.
Every paged output is checked against SDPA's before it is timed: a mismatch fails the run
(exit 1) and nothing is written to the docs. Targets: decode at batch 64 × 4k context, block 16,
at ≥ 80% of the copy bandwidth; paged/SDPA decode time ≤ 1.1 at every block size. Writes the
`## Kernels` section of docs/benchmarks.md (report.py) and docs/img/kernels_bench.png
(plot.py); `--results-dir` also keeps the raw numbers as kernels_bench.json.

Without a GPU, --quick runs every code path at tiny fp32 shapes under the Triton interpreter
(TRITON_INTERPRET=1, set here before triton is imported) and checks the outputs; its timings
mean nothing. A full run without a GPU refuses (exit 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from bench.kernels.config import FULL, QUICK, TARGETS
from bench.kernels.report import (Results, decode_grid, prefill_grid, rate, result_rows,
                                  section_body, target_lines, write_json)
from bench.report import add_output_flags, output_paths, replace_section, text_grid, text_table
from kernels.triton_support import interpreting

NO_GPU_EXIT = 2
DEFAULT_MAX_KV_GIB = 40.0
# Device memory a combination holds per byte of its K+V (measure.paged_copy), with room
# for the allocator's slack.
PEAK_PER_KV_BYTE = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.kernels",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--max-kv-gib", type=float, default=None,
                        help="skip combinations whose K+V take more than this (GiB); the run "
                             "holds about 2.5 times it: paged, contiguous and the copy between "
                             f"(default {DEFAULT_MAX_KV_GIB:g}, or less on a GPU with under "
                             f"{DEFAULT_MAX_KV_GIB * PEAK_PER_KV_BYTE:g} GiB)")
    parser.add_argument("--prefill-block-sizes", type=int, nargs="+", default=None,
                        help=f"block sizes of the prefill sweep (default "
                             f"{' '.join(map(str, FULL.prefill_block_sizes))})")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also write the raw results there as kernels_bench.json")
    parser.add_argument("--targets", action="store_true",
                        help="measure only the full run's target points (decode at batch "
                             f"{FULL.target_batch} x {FULL.target_context} at every block size, "
                             "one prefill): about a minute on a GPU; like --quick, writes no "
                             "docs unless --out-md / --out-png are given")
    args = parser.parse_args(argv)
    if args.targets and args.quick:
        parser.error("--targets measures the full shapes' target points; --quick the smoke "
                     "shapes: give one")
    return args


def describe_versions(torch_module, on_gpu: bool) -> str:
    import triton

    cuda = f", CUDA {torch_module.version.cuda}" if on_gpu else ""
    return f"torch {torch_module.__version__}, triton {triton.__version__}{cuda}"


def describe_device(torch_module, on_gpu: bool) -> str:
    if on_gpu:
        return torch_module.cuda.get_device_name()
    from bench.report import cpu_model

    return f"CPU ({cpu_model()}), Triton interpreter"


def max_kv_gib(requested: float | None, torch_module, on_gpu: bool) -> float:
    """The budget asked for, or one the device holds: the largest full-sweep combination
    (batch 256 × 16k) takes 16 GiB of K+V, which a smaller GPU cannot hold 2.5 times."""
    if requested is not None:
        return requested
    if not on_gpu:
        return DEFAULT_MAX_KV_GIB
    device_gib = torch_module.cuda.get_device_properties(0).total_memory / 1024**3
    return min(DEFAULT_MAX_KV_GIB, device_gib / PEAK_PER_KV_BYTE)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    if not args.quick and (not on_gpu or interpreting()):
        why = ("no CUDA GPU is visible" if not on_gpu
               else "TRITON_INTERPRET is set, so Triton would interpret the kernels")
        print(f"bench.kernels times Triton kernels on a CUDA GPU, and {why}. Run it on a GPU "
              "machine (`make bench-kernels`), or pass --quick for a smoke run whose timings "
              "mean nothing. Nothing was written.", file=sys.stderr)
        return NO_GPU_EXIT
    if not on_gpu:
        # Triton picks compiled or interpreted when a kernel is defined, so before the import.
        os.environ["TRITON_INTERPRET"] = "1"
    from tqdm import tqdm

    from bench.kernels import measure

    shapes = QUICK if args.quick else TARGETS if args.targets else FULL
    if args.prefill_block_sizes:
        shapes = dataclasses.replace(shapes, prefill_block_sizes=tuple(args.prefill_block_sizes))
    device = torch.device("cuda" if on_gpu else "cpu")
    # bf16 is what a server keeps its cache in; the interpreter computes on numpy, which has no
    # bf16, so the CPU smoke run uses fp32.
    dtype = torch.bfloat16 if on_gpu else torch.float32
    out_md, out_png = output_paths(args, "kernels_bench.png")
    if args.targets:
        out_md, out_png = args.out_md, args.out_png
    results = Results(shapes, describe_device(torch, on_gpu), str(dtype).removeprefix("torch."),
                      describe_versions(torch, on_gpu),
                      max_kv_gib(args.max_kv_gib, torch, on_gpu),
                      interpreted=interpreting())

    torch.manual_seed(0)
    results.copy_gbs = measure.copy_bandwidth_gbs(shapes, dtype, device)
    print(f"copy bandwidth on {results.device}: {rate(results.copy_gbs)} GB/s")
    with tqdm(total=shapes.decode_combos + shapes.prefill_combos, unit="combo",
              file=sys.stderr) as progress:
        measure.measure_decode(results, dtype, device, progress)
        measure.measure_prefill(results, dtype, device, progress)

    print(text_grid(*decode_grid(results, results.decode)))
    print()
    print(text_grid(*prefill_grid(results)))
    print()
    print(text_table(result_rows(results)))
    print()
    print("\n".join(target_lines(results)))
    if results.interpreted:
        print("CPU smoke run under the Triton interpreter: the timings above mean nothing; "
              "only the correctness checks count.")
    if args.results_dir is not None:
        print(f"raw results: {write_json(results, args.results_dir)}")
    mismatches = results.mismatches()
    if mismatches:
        print(f"{len(mismatches)} paged output(s) differ from SDPA's on the same K/V (see "
              "MISMATCH above); not writing the docs.", file=sys.stderr)
        return 1
    if out_png is not None:
        from bench.kernels.plot import write_plot

        write_plot(results, out_png)
        print(f"plot: {out_png}")
    if out_md is not None:
        replace_section(out_md, "Kernels", section_body(results, out_png, out_md))
        print(f"results: {out_md} (## Kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
