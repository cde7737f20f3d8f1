"""The executor service: one per GPU (or CPU). It loads a checkpoint into its own model code
(model/), owns the KV-cache tensors, runs continuous batching (engine/: scheduling, the forward
pass, sampling), asks the allocator for every block over gRPC (allocator_client.py), and streams
token ids to the gateway (servicer.py, serving_loop.py)."""
