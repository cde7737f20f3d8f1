#!/usr/bin/env bash
# Checks our GPU path on a lent GPU machine in one command of under ten minutes, writing one
# results folder. Here, where pip reaches the package registry, then there, from the repository
# root, with .device-wheels/ carried along:
#
#     make device-wheels                          # here: what that machine lacks, as wheels
#     scripts/device_check.sh [RESULTS_DIR]       # there (default RESULTS_DIR: device-results)
#     scripts/device_check.sh --print-test-files  # only list the test files step 2 runs
#
# Steps, each timed into summary.txt; one that fails does not stop the others:
#   1. wheels   .device-wheels/*.whl (scripts/device_wheels.txt) installed into a scratch folder
#               that goes on PYTHONPATH after the repository root (so nothing is pip-installed)
#   2. pytest   `pytest -m gpu` over the test files that hold gpu tests: the Triton kernels
#               compiled and checked against their references, the KV cache sized from measured
#               GPU memory
#   3. bench    bench/gpu_all.sh --quick: the kernel, engine throughput and serving benchmarks
#               in their smoke sizes, on the GPU
# RESULTS_DIR gets environment.txt, pytest-gpu.log, pytest-gpu.xml (JUnit), bench/ (what
# gpu_all.sh writes: logs, sections, plots, raw JSON) and summary.txt. The exit status is the
# first failing step's, 0 when all passed.
#
# The Python is $PYTHON, else .venv/bin/python when `make` has set one up, else python3. Without
# a CUDA GPU it says so and exits 2, having installed and written nothing.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$ROOT/.device-wheels"
SITE="${TMPDIR:-/tmp}/pagedserve-device-site"
# The distributions the wheels bring, reported in environment.txt beside the machine's own.
WHEEL_DISTRIBUTIONS=(grpcio-health-checking grpcio-reflection starlette uvicorn redis hiredis)

# Files that hold gpu tests, marked directly or parametrized over kernel_cases.TRITON_DEVICES.
# Only these are collected: the others import packages the machine may lack (openai, ...).
gpu_test_files() {
    (cd "$ROOT" && grep -rlE 'mark\.gpu|TRITON_DEVICES' tests --include='test_*.py' | sort)
}

if [[ "${1:-}" == "--print-test-files" ]]; then
    gpu_test_files
    exit 0
fi
if [[ $# -gt 1 || "${1:-}" == -* ]]; then
    echo "usage: scripts/device_check.sh [--print-test-files] [RESULTS_DIR]" >&2
    exit 64
fi
out="$(realpath -m "${1:-device-results}")"

# shellcheck source=scripts/gpu_python.sh
source "$ROOT/scripts/gpu_python.sh"
export PYTHON="$python"    # bench/gpu_all.sh runs the benchmarks with it too

require_cuda device_check.sh

mkdir -p "$out"
cd "$ROOT"
: >"$out/summary.txt"
first_failure=0

record() {  # step name, exit status, start second -> a line of summary.txt
    echo "$1: exit $2 after $((SECONDS - $3)) s" | tee -a "$out/summary.txt"
    if [[ $2 -ne 0 && $first_failure -eq 0 ]]; then
        first_failure=$2
    fi
}

start=$SECONDS
wheels=("$WHEELS"/*.whl)
if [[ -e "${wheels[0]}" ]]; then
    echo "== wheels: ${#wheels[@]} from $WHEELS into $SITE"
    rm -rf "$SITE"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}" 2>&1 | tee "$out/wheels.log"
    record wheels "${PIPESTATUS[0]}" $start
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "wheels: none in $WHEELS (make device-wheels), so none installed" \
        | tee -a "$out/summary.txt"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi

{
    echo "python: $python"
    echo "PYTHONPATH: $PYTHONPATH"
    "$python" -m bench.environment "${WHEEL_DISTRIBUTIONS[@]}"
} >"$out/environment.txt" 2>&1

mapfile -t test_files < <(gpu_test_files)
echo "== pytest: -m gpu over ${test_files[*]}"
start=$SECONDS
if [[ ${#test_files[@]} -eq 0 ]]; then
    # pytest given no file would collect every test, and import what this machine lacks.
    echo "no test file holds gpu tests" | tee "$out/pytest-gpu.log"
    record pytest 5 $start    # pytest's own status for "no tests collected"
else
    PYTHONUNBUFFERED=1 "$python" -m pytest -m gpu -p no:cacheprovider -q \
        --junitxml "$out/pytest-gpu.xml" "${test_files[@]}" 2>&1 | tee "$out/pytest-gpu.log"
    record pytest "${PIPESTATUS[0]}" $start
fi

echo "== bench: bench/gpu_all.sh --quick $out/bench"
start=$SECONDS
bash bench/gpu_all.sh --quick "$out/bench"
record bench $? $start

echo "results in $out"
exit $first_failure
