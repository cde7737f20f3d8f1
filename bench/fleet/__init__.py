"""The fleet benchmark: how many executors one allocator process serves at GPU step rates.

Simulated executors (sim_executor.py) run the real engine, scheduler and allocator client
against a real allocator service, with the forward pass replaced by a timed wait and the
sampler by seeded random tokens, and record their Step streams. Two cores cannot run a hundred
schedulers, so replay.py then plays many recorded streams at their original pace with a cheap
driver, and the allocator sees the load of N executors. `python -m bench.fleet` runs both and
writes `## Fleet` in docs/benchmarks.md.
"""
