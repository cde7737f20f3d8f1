"""Sharing benchmark: KV blocks saved by fork (parallel sampling) and by the prefix cache."""
