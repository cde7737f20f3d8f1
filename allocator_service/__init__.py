"""The allocator service: the one owner of every executor's KV-cache blocks.

Three layers, each importing only those below it:

    server/      gRPC servicers, proto <-> domain views, configuration, auth
    durability/  the journal of commands, snapshots, the Redis state store, the state gate
    core/        pools, free lists, block tables, prefix hashes, copy-on-write (pure Python)

`local_block_allocator.py` is the core's in-process front door: the engine's BlockAllocator
without gRPC, for tests, benchmarks and offline runs.
"""
