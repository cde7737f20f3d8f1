# Two commands do all set-up on a fresh machine: `make run` and `make test`.
# Everything is installed into .venv (the project) and .venv-protoc (the pinned code generator).

PYTHON      ?= python3
VENV        := .venv
BIN         := $(VENV)/bin
INSTALLED   := $(VENV)/.installed
PROTOC_VENV := .venv-protoc
PROTOC_PY   := $(PROTOC_VENV)/bin/python
# protoc 25 (grpcio-tools 1.62) writes protobuf-4.25 gencode, which protobuf runtimes 4.25 .. 7.x
# all import; newer generators stamp a minimum runtime that older GPU images may not have.
GRPCIO_TOOLS := grpcio-tools==1.62.3
PROTO_SRC   := $(shell find protos -name '*.proto' | sort)
# `make run PORT=N` moves the whole stack: gateway gRPC N, allocator N+1, executor N+2, HTTP N+100
# (unset: 50051, 50052, 50053, 8000).
PORT        ?=
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The torch build for this machine (scripts/torch_backend.py): auto takes the CPU build without an
# NVIDIA driver and the CUDA build the driver runs with one; `make run TORCH_BACKEND=cpu` (or
# cu128, cu130) chooses. The version is pyproject.toml's pin.
TORCH_VERSION := 2.13.0
TORCH_BACKEND ?= auto

.PHONY: run test protos check-protos redis-server clean bench bench-kernels bench-gpu docs soak \
        bench-peers bench-beam device-wheels allocator-core

# torch first and alone (--no-deps: only torch itself is looked up on PyTorch's index), so the
# project's install below finds it satisfied and fetches its dependencies from the registry.
# --no-compile: pip would compile every module of every package to bytecode (25,000 files,
# about a minute of a 2-core machine's set-up); Python compiles the few hundred a process
# imports on first use instead, about 2 s once.
PIP_INSTALL := $(BIN)/pip install --quiet --disable-pip-version-check --no-compile
$(INSTALLED): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	torch_args="$$($(PYTHON) scripts/torch_backend.py $(TORCH_BACKEND))" && \
		$(PIP_INSTALL) --no-deps $$torch_args 'torch==$(TORCH_VERSION)'
	$(PIP_INSTALL) -e '.[dev]'
	@touch $@

$(PROTOC_PY):
	$(PYTHON) -m venv $(PROTOC_VENV)
	$(PROTOC_VENV)/bin/pip install --quiet --disable-pip-version-check '$(GRPCIO_TOOLS)'

# Regenerates the checked-in stubs under pagedserve/ from protos/ (never edit them by hand).
protos: $(PROTOC_PY)
	$(PROTOC_PY) scripts/gen_protos.py

check-protos: $(PROTOC_PY)
	$(PROTOC_PY) scripts/gen_protos.py --check

# Rewrites the generated references: docs/configuration.md from the argument parsers,
# docs/api-grpc.md from the protos and the bad-input table of docs/reliability.md from the
# bad-input tests' cases (tests fail when any is stale).
# The generators run as modules from the repository root, so they import the project and tests/.
docs: $(INSTALLED) $(PROTOC_PY)
	$(BIN)/python -m scripts.gen_config_reference
	$(PROTOC_PY) -m scripts.gen_api_reference
	$(BIN)/python -m scripts.gen_bad_input_table
	$(BIN)/python -m scripts.gen_field_table

redis-server:
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server; }

# The allocator core's hot modules compiled with mypyc into build/allocator-core/ (about 5×
# on the Step path); a no-op while that build matches the sources, and without a C compiler it
# says so and the Python core runs (scripts/build_allocator_core.py).
allocator-core: $(INSTALLED)
	@$(BIN)/python -m scripts.build_allocator_core

# The suite runs in TEST_WORKERS processes, each test file whole in one of them (its
# module-scoped stacks start once): most tests wait on services they start, and one process
# kept one of two cores busy (2026-11-27: 15.7 min alone, 12.4 min in two workers).
# `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 2
test: $(INSTALLED) $(PROTOC_PY) redis-server allocator-core
	PROTOC_PYTHON=$(CURDIR)/$(PROTOC_PY) $(BIN)/python -m pytest -q -p no:cacheprovider \
		$(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# Starts the whole stack on loopback (allocator, executor, gateway on the embedded default),
# streams a demo generation through the gateway, shows `pagedctl stats`, serves until Ctrl-C.
run: $(INSTALLED) allocator-core
	$(BIN)/pagedserve up $(if $(PORT),--base-port $(PORT)) --demo "The paged KV cache"

# Each benchmark rewrites its own section of docs/benchmarks.md and its plot under docs/img/.
bench: $(INSTALLED) redis-server allocator-core
	$(BIN)/python -m bench.allocator
	$(BIN)/python -m bench.durability
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.iteration
	$(BIN)/python -m bench.memory
	$(BIN)/python -m bench.sharing
	$(BIN)/python -m bench.serve
	$(BIN)/python -m bench.fleet

# Ten minutes of mixed load through the whole stack, with random cancels and one allocator
# kill -9 (bench/soak/); stops by itself, fails when a block leaked, an answer was wrong or a
# process's memory grew, and rewrites `## Soak` of docs/reliability.md and its plot.
soak: $(INSTALLED) redis-server
	$(BIN)/python -m bench.soak

# pagedserve against vLLM's CPU build on the same checkpoints with vLLM's own client
# (bench/peers/): installs the peer into .venv-peer/ on first use (not .venv), then rewrites
# `## Peers` and its plot. About 20 minutes on 2 cores; not part of `make bench`.
bench-peers: $(INSTALLED)
	$(BIN)/python -m bench.peers

# Beam search against transformers and vLLM (installs the peer like bench-peers); rewrites
# `## Beam search` and its plot.
bench-beam: $(INSTALLED)
	$(BIN)/python -m bench.beam

# Needs a CUDA GPU (without one it says so and exits 2); rewrites `## Kernels` and its plot.
bench-kernels: $(INSTALLED)
	$(BIN)/python -m bench.kernels

# Every GPU-relevant benchmark (kernels, engine throughput, serving) into one folder, on a CUDA
# machine: `make bench-gpu RESULTS=gpu-results`. Without a GPU it says so and exits 2.
RESULTS ?= gpu-results
bench-gpu: $(INSTALLED)
	PYTHON=$(CURDIR)/$(BIN)/python bench/gpu_all.sh $(RESULTS)

# The wheels a lent GPU machine lacks (scripts/device_wheels.txt says which and why), for its
# Python 3.12 on x86-64, into .device-wheels/; that folder travels with the working tree, and
# scripts/device_check.sh there installs them before it checks the GPU path.
device-wheels: $(INSTALLED)
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--python-version 3.12 --implementation cp \
		--platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform manylinux1_x86_64 -d .device-wheels -r scripts/device_wheels.txt

clean:
	rm -rf $(VENV) $(PROTOC_VENV) .venv-peer build/allocator-core
