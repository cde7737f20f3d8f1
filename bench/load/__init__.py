"""Load the benchmarks and tests share: allocator client and workloads, impatient clients."""
