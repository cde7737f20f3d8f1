"""Soak: mixed load with cancels and an allocator kill -9 through the whole stack."""
