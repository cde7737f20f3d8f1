"""Torch implementations tuned for serving on the CPU, where the per-sequence reference would
spend its time in Python and tiny kernels. Each is tested against its reference."""
