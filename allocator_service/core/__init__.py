"""The allocator core: pure Python, no gRPC, no Redis. Every executor's pool of blocks, their
free lists and prefix index, sequences and their block tables, and the batched Step."""
