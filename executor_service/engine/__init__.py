"""The executor's engine: requests and their sequences, scheduling, the model step and sampling;
no gRPC. It is built with the BlockAllocator it sends its Steps to (block_allocator.py)."""
