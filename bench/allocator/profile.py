"""`bench.allocator --profile`: where the in-process time of a Step goes.

Two views, because cProfile's per-call overhead inflates small, frequent functions: cProfile's
hottest functions (which code), and a decomposition of one decode step timed directly (how much):
validation, the ExecutorPool.append calls, and the rest of
Allocator.step (dispatch and result objects). Nothing here is written to the docs.
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from allocator_service.core.allocator import Allocator
from allocator_service.core.executor_pool import ExecutorPool
from allocator_service.core.validation import validate_ops
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import MemoryStore
from allocator_service.server.allocator_servicer import AllocatorServicer
from bench.load.allocator_rpc import local_allocator, step_request
from bench.load.allocator_workload import DecodeBatch, ServingMix
from pagedserve.protocol.block_ops import AppendOp


def print_profile(title: str, run: Callable[[], None], top: int = 15) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"\n{title}: {total:.2f} s profiled; top {top} by own time (share of profiled time)")
    print(f"{'own':>6} {'cum':>6} {'calls':>9}  function")
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, own, cumulative, _) in rows[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else "~"
        print(f"{own / total:6.1%} {cumulative / total:6.1%} {calls:>9,}  {where}({name})")


# A part of Allocator.step, run on its own: (core, epoch, pool, step_id, ops).
Part = Callable[[Allocator, int, ExecutorPool, int, list[AppendOp]], object]

PARTS: dict[str, Part] = {
    "validate_ops": lambda core, epoch, pool, step_id, ops: validate_ops(core.limits, ops),
    "ExecutorPool.append per op": lambda core, epoch, pool, step_id, ops: [
        pool.append(op.seq_id, op.token_ids, op.lookahead_slots, op.num_computed_tokens)
        for op in ops],
}


def decompose_decode_step(num_blocks: int, block_size: int, batch: int, steps: int) -> None:
    """Median time of each part of Allocator.step for one decode step, each part timed alone
    on its own pool fed the same ops; the rest is dispatch and result objects."""
    def median_ms(part: Part) -> float:
        core, epoch = local_allocator(num_blocks, block_size)
        decode = DecodeBatch(batch, seed=6)
        core.step("bench", epoch, 1, decode.allocations())
        pool, timings = core.executors["bench"].pool, []
        for step_id in range(2, steps + 2):
            ops = decode.next_appends()
            start = time.perf_counter()
            part(core, epoch, pool, step_id, ops)
            timings.append(time.perf_counter() - start)
        return statistics.median(timings) * 1e3

    whole = median_ms(lambda core, epoch, pool, step_id, ops: core.step("bench", epoch,
                                                                        step_id, ops))
    measured = {name: median_ms(part) for name, part in PARTS.items()}
    print(f"\nAllocator.step, one decode step of {batch} appends, timed directly (median of "
          f"{steps} steps): {whole:.3f} ms")
    measured["rest (dispatch, result objects)"] = whole - sum(measured.values())
    for name, ms in measured.items():
        print(f"  {name:<32} {ms:.3f} ms  {ms / whole:6.1%}")


def profile_hot_paths(num_blocks: int, block_size: int, batch: int, warmup_steps: int,
                      steps: int) -> None:
    """cProfile of Allocator.step on the serving mix and of the servicer's Step handler on
    decode steps (ops and requests are built before the profiler starts), then the direct
    decomposition of a decode step."""
    core, epoch = local_allocator(num_blocks, block_size)
    mix = ServingMix(seed=5, max_running=batch)
    for step_id in range(1, warmup_steps + 1):
        core.step("bench", epoch, step_id, mix.next_step())
    mix_steps = [mix.next_step() for _ in range(steps)]

    def run_mix() -> None:
        for step_id, ops in enumerate(mix_steps, start=warmup_steps + 1):
            core.step("bench", epoch, step_id, ops)

    print_profile("Allocator.step, serving mix", run_mix)

    handler_core, handler_epoch = local_allocator(num_blocks, block_size)
    servicer = AllocatorServicer(AllocatorState(handler_core, MemoryStore()))
    decode = DecodeBatch(batch, seed=5)
    servicer.Step(step_request("bench", handler_epoch, 1, decode.allocations()), None)
    requests = [step_request("bench", handler_epoch, step_id, decode.next_appends())
                for step_id in range(2, steps + 2)]

    def run_handler() -> None:
        for request in requests:
            servicer.Step(request, None)  # type: ignore[arg-type]

    print_profile(f"AllocatorServicer.Step in-process, {batch} appends per step", run_handler)
    decompose_decode_step(num_blocks, block_size, batch, steps)
