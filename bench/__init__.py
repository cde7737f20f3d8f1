"""pagedserve's benchmarks, one subpackage per family, each run from the repository root as
`python -m bench.<family>` (`--help` for its flags; `make bench` runs the CPU ones):

- `allocator`: the allocator core and its Step RPC, batched and unbatched;
- `durability`: what the Redis journal costs a Step, and the restart after kill -9;
- `kernels`: the paged decode / prefill Triton kernels (needs a CUDA GPU; `make bench-kernels`);
- `memory`: KV slots holding tokens, paged against contiguous reservation;
- `peers`: pagedserve against vLLM's CPU build, with vLLM's own client (`make bench-peers`);
- `serve`: the whole stack through gRPC and HTTP against the in-process engine;
- `sharing`: KV blocks saved by fork (parallel sampling) and by the prefix cache;
- `soak`: minutes of mixed load with cancels and an allocator kill -9 (`make soak`);
- `throughput`: the engine against transformers' `generate` and `generate_batch`.

Shared by them: `bench.report` (tables, the docs section a run rewrites, the output flags),
`bench.plot` (matplotlib set-up and saving) and `bench.load` (clients and workloads several
families and the tests drive). `bench/gpu_all.sh` runs the GPU-relevant ones into one folder.
"""
