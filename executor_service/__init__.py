"""Executor service: models, continuous batching and KV-cache tensors (a later issue)."""
