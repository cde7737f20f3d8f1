"""Triton paged-attention kernels with torch references (a later issue)."""
