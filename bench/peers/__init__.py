"""Peer benchmark: pagedserve against vLLM (CPU build) on the same checkpoint and client."""
