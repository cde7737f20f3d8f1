#!/usr/bin/env bash
# Every GPU-relevant benchmark in one command, on a machine with a CUDA GPU:
#
#     bench/gpu_all.sh RESULTS_DIR            # the full runs (about half an hour on one H100/H200)
#     bench/gpu_all.sh --quick RESULTS_DIR    # the kernels' target points, the other scripts'
#                                             # smoke runs, on the GPU (a few minutes)
#     bench/gpu_all.sh --print-commands DIR   # only print what would run (what the tests check)
#
# Runs, in this order, each writing into RESULTS_DIR and nowhere else:
#   1. -m bench.kernels           paged decode / prefill kernels against copy bandwidth and SDPA
#   2. -m bench.throughput --gpu  our engine against transformers' generate and generate_batch
#   3. -m bench.serve --gpu       the whole stack (allocator, executor, gateway) against the
#                                 in-process engine, gRPC and HTTP
# RESULTS_DIR gets benchmarks.md (each script's section, as docs/benchmarks.md would), the PNG
# plots, each script's raw JSON, a log per script, environment.txt (GPU, driver, packages) and
# summary.txt (each benchmark's exit status). A benchmark that fails does not stop the others; the
# exit status is that of the first failure. To publish, copy the sections into
# docs/benchmarks.md and the plots into docs/img/.
#
# The Python is $PYTHON, else .venv/bin/python when `make` has set one up, else python3. It
# needs the project importable (`pip install -e .`, or PYTHONPATH=. with its dependencies
# installed). Without a CUDA GPU it says so and exits 2, writing nothing.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

quick=()
print_only=0
while [[ $# -gt 0 && "$1" == --* ]]; do
    case "$1" in
        --quick) quick=(--quick) ;;
        --print-commands) print_only=1 ;;
        *) echo "gpu_all.sh: unknown option $1" >&2; exit 64 ;;
    esac
    shift
done
if [[ $# -ne 1 ]]; then
    echo "usage: bench/gpu_all.sh [--quick] [--print-commands] RESULTS_DIR" >&2
    exit 64
fi
out="$(realpath -m "$1")"

# shellcheck source=scripts/gpu_python.sh
source "$ROOT/scripts/gpu_python.sh"

# name|module and its flags (the output flags are added below); run from the repository root
benchmarks=(
    "kernels|-m bench.kernels"
    "throughput|-m bench.throughput --gpu"
    "serve|-m bench.serve --gpu"
)

command_for() {  # name, module with flags -> the whole command line
    local name="$1" module="$2" mode="${quick[*]}"
    # The kernels' smoke shapes are too small to judge a GPU by; their target points alone
    # take about a minute, so a quick run measures those.
    if [[ -n "$mode" && "$name" == kernels ]]; then
        mode=--targets
    fi
    echo "$python $module${mode:+ $mode} --out-md $out/benchmarks.md" \
         "--out-png $out/${name}_bench.png --results-dir $out"
}

if [[ $print_only -eq 1 ]]; then
    for entry in "${benchmarks[@]}"; do
        command_for "${entry%%|*}" "${entry#*|}"
    done
    exit 0
fi

require_cuda gpu_all.sh

mkdir -p "$out"
cd "$ROOT"
"$python" -m bench.environment >"$out/environment.txt" 2>&1

first_failure=0
: >"$out/summary.txt"
for entry in "${benchmarks[@]}"; do
    name="${entry%%|*}"
    command="$(command_for "$name" "${entry#*|}")"
    echo "== $name: $command"
    start=$SECONDS
    # shellcheck disable=SC2086  # the command line is ours, split on purpose
    PYTHONUNBUFFERED=1 $command 2>&1 | tee "$out/$name.log"
    status=${PIPESTATUS[0]}
    echo "$name: exit $status after $((SECONDS - start)) s" | tee -a "$out/summary.txt"
    if [[ $status -ne 0 && $first_failure -eq 0 ]]; then
        first_failure=$status
    fi
done
echo "results in $out"
exit $first_failure
