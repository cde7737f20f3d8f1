"""Throughput benchmark: our engine against transformers' generate and generate_batch."""
