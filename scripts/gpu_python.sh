# Sourced by bench/gpu_all.sh and scripts/device_check.sh, after they set ROOT to the repository
# root. Sets $python, the Python both run: $PYTHON, else .venv/bin/python when `make` has set one
# up, else python3. Defines require_cuda: without a CUDA GPU visible to that Python it says so
# (naming the calling script) and exits 2, before the caller has written anything.

if [[ -n "${PYTHON:-}" ]]; then
    python="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    python="$ROOT/.venv/bin/python"
else
    python=python3
fi

require_cuda() {  # the calling script's name
    if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "$1: no CUDA GPU is visible to $python. Nothing was written." >&2
        exit 2
    fi
}
