"""Kernels benchmark: paged decode and prefill against the copy bandwidth and SDPA (CUDA)."""
