"""Allocator benchmark: core ops/s, batched vs one-op-per-RPC Step, and Step latency.

    .venv/bin/python -m bench.allocator            # full run (well under two minutes)
    .venv/bin/python -m bench.allocator --quick    # smoke run; writes nothing unless told

Everything compared is measured side by side in one run, interleaved where it can be, and the
comparisons are stated as ratios: the machines this runs on are small and noisy. Writes the
`## Allocator` section of docs/benchmarks.md and docs/img/allocator_bench.png.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from tqdm import tqdm

from allocator_service.core.executor_pool import ExecutorPool
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import MemoryStore
from allocator_service.server.allocator_servicer import AllocatorServicer
from bench.allocator.plot import write_plot
from bench.allocator.report import Results, result_rows, section_body
from bench.load.allocator_rpc import (StepClient, allocator_server, connect, local_allocator,
                                      step_request)
from bench.load.allocator_workload import VOCAB_SIZE, DecodeBatch, ServingMix
from bench.report import add_output_flags, output_paths, replace_section, text_table
from pagedserve.allocator.v1 import allocator_pb2 as pb


@dataclass(slots=True, frozen=True)
class Sizes:
    num_blocks: int = 16_384
    block_size: int = 16
    # Running sequences: ops per decode step. Each decode pool holds batch sequences of 128
    # prompt tokens plus every token appended to them, so the step counts below stay within
    # num_blocks * block_size / batch tokens per sequence (an overflow shows as not-OK ops).
    batch: int = 256
    # Timed parts run in rounds so one noisy second does not decide a number.
    rounds: int = 5
    mix_warmup_steps: int = 400
    mix_steps: int = 1_000
    append_warmup_rounds: int = 16
    append_rounds: int = 160
    rpc_warmup_steps: int = 20
    batched_steps: int = 100
    # Each iteration is `batch` RPCs of one op.
    per_op_iterations: int = 2
    latency_warmup_steps: int = 50
    latency_steps: int = 500


QUICK = Sizes(rounds=1, mix_warmup_steps=20, mix_steps=40, append_warmup_rounds=2,
              append_rounds=8, rpc_warmup_steps=3, batched_steps=10, per_op_iterations=1,
              latency_warmup_steps=5, latency_steps=30)


# -- 1. in-process -----------------------------------------------------------------------------

def bench_core_mix(sizes: Sizes, results: Results) -> None:
    """The serving mix through Allocator.step; every op counts as one block op."""
    core, epoch = local_allocator(sizes.num_blocks, sizes.block_size)
    mix = ServingMix(seed=1, max_running=sizes.batch)
    step_id = 0
    total = sizes.mix_warmup_steps + sizes.rounds * sizes.mix_steps
    with tqdm(total=total, desc="core mix (Allocator.step)", unit="step", leave=False) as bar:
        def run(steps: int) -> tuple[int, float]:
            nonlocal step_id
            num_ops, elapsed = 0, 0.0
            for _ in range(steps):
                ops = mix.next_step()
                step_id += 1
                start = time.perf_counter()
                result = core.step("bench", epoch, step_id, ops)
                elapsed += time.perf_counter() - start
                num_ops += len(ops)
                results.num_not_ok += sum(1 for r in result.results if r.status)
                bar.update()
            return num_ops, elapsed

        run(sizes.mix_warmup_steps)
        mix.op_counts.clear()
        timed = [run(sizes.mix_steps) for _ in range(sizes.rounds)]
    results.mix_ops_s = sum(n for n, _ in timed) / sum(t for _, t in timed)
    results.mix_counts = dict(mix.op_counts)


def bench_pool_append(sizes: Sizes, results: Results) -> None:
    """ExecutorPool.append alone: one token per sequence per round, computed mark advancing."""
    pool = ExecutorPool(sizes.num_blocks, sizes.block_size, "bench")
    decode = DecodeBatch(sizes.batch, seed=2)
    for op in decode.allocations():
        pool.allocate(op.seq_id, op.token_ids, op.cache_salt, op.lookahead_slots)
    rng = random.Random(2)
    tokens = [(rng.randrange(VOCAB_SIZE),) for _ in range(sizes.batch)]
    num_tokens, append, lookahead = decode.num_tokens, pool.append, decode.lookahead_slots

    def run(rounds: int) -> float:
        start = time.perf_counter()
        for _ in range(rounds):
            for index, seq_id in enumerate(decode.seq_ids):
                if append(seq_id, tokens[index], lookahead, num_tokens[index]) is None:
                    results.num_not_ok += 1
                num_tokens[index] += 1
        return time.perf_counter() - start

    run(sizes.append_warmup_rounds)
    elapsed = 0.0
    for _ in tqdm(range(sizes.rounds), desc="ExecutorPool.append", unit="round", leave=False):
        elapsed += run(sizes.append_rounds)
    results.pool_append_s = sizes.rounds * sizes.append_rounds * sizes.batch / elapsed


# -- 2. batched Step vs one RPC per op --------------------------------------------------------

def bench_batched_vs_per_op(sizes: Sizes, channel: grpc.Channel, results: Results) -> None:
    """The same decode work two ways, in alternating rounds; request building is timed too."""
    clients, decodes = [], []
    for name in ("bench-batched", "bench-per-op"):
        client = StepClient(channel, name, sizes.num_blocks, sizes.block_size)
        decode = DecodeBatch(sizes.batch, seed=3)
        client.step(decode.allocations())
        clients.append(client)
        decodes.append(decode)
    (batched, per_op), (batched_work, per_op_work) = clients, decodes

    def run_batched(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            batched.step(batched_work.next_appends())
        return time.perf_counter() - start

    def run_per_op(iterations: int) -> float:
        start = time.perf_counter()
        for _ in range(iterations):
            for op in per_op_work.next_appends():
                per_op.step([op])
        return time.perf_counter() - start

    run_batched(sizes.rpc_warmup_steps)
    run_per_op(1)
    batched_s = per_op_s = 0.0
    for _ in tqdm(range(sizes.rounds), desc="Step: batched vs per-op", unit="round", leave=False):
        batched_s += run_batched(sizes.batched_steps)
        per_op_s += run_per_op(sizes.per_op_iterations)
    batched_ops = sizes.rounds * sizes.batched_steps * sizes.batch
    results.batched_ops_s = batched_ops / batched_s
    results.per_op_ops_s = sizes.rounds * sizes.per_op_iterations * sizes.batch / per_op_s
    results.num_not_ok += batched.num_not_ok + per_op.num_not_ok


# -- 3. Step latency, and what the RPC hop adds --------------------------------------------------

def bench_step_latency(sizes: Sizes, channel: grpc.Channel, results: Results) -> None:
    """One decode step at a time, four ways in turn: over loopback (client-side time),
    Allocator.step in-process, the servicer's handler in-process (proto -> domain -> proto,
    no transport), and protobuf serialize + parse of that request and response."""
    client = StepClient(channel, "bench-latency", sizes.num_blocks, sizes.block_size)
    core, core_epoch = local_allocator(sizes.num_blocks, sizes.block_size)
    handler_core, handler_epoch = local_allocator(sizes.num_blocks, sizes.block_size)
    servicer = AllocatorServicer(AllocatorState(handler_core, MemoryStore()))
    rpc_work, core_work, handler_work = (DecodeBatch(sizes.batch, seed=4) for _ in range(3))
    client.step(rpc_work.allocations())
    core.step("bench", core_epoch, 1, core_work.allocations())
    servicer.Step(step_request("bench", handler_epoch, 1, handler_work.allocations()), None)

    def one_step(step_id: int) -> tuple[float, float, float, float]:
        request = client.request(rpc_work.next_appends())
        start = time.perf_counter()
        response = client.stub.Step(request)
        rpc_s = time.perf_counter() - start
        client.check(response)

        ops = core_work.next_appends()
        start = time.perf_counter()
        result = core.step("bench", core_epoch, step_id, ops)
        core_s = time.perf_counter() - start
        results.num_not_ok += sum(1 for r in result.results if r.status)

        local_request = step_request("bench", handler_epoch, step_id,
                                     handler_work.next_appends())
        start = time.perf_counter()
        local_response = servicer.Step(local_request, None)
        handler_s = time.perf_counter() - start

        start = time.perf_counter()
        pb.StepRequest.FromString(local_request.SerializeToString())
        pb.StepResponse.FromString(local_response.SerializeToString())
        return rpc_s, core_s, handler_s, time.perf_counter() - start

    total = sizes.latency_warmup_steps + sizes.latency_steps
    with tqdm(total=total, desc=f"Step latency ({sizes.batch} appends)", unit="step",
              leave=False) as bar:
        for step_id in range(2, 2 + sizes.latency_warmup_steps):
            one_step(step_id)
            bar.update()
        with full_gc_pauses(results.gc_full_pauses):
            for step_id in range(2 + sizes.latency_warmup_steps, 2 + total):
                rpc_s, core_s, handler_s, wire_s = one_step(step_id)
                results.rpc_step.append(rpc_s)
                results.core_step.append(core_s)
                results.handler_step.append(handler_s)
                results.wire_step.append(wire_s)
                bar.update()
    results.num_not_ok += client.num_not_ok


@contextmanager
def full_gc_pauses(pauses: list[float]) -> Iterator[None]:
    """Appends the duration of every generation-2 collection of this process to `pauses`."""
    started = 0.0

    def on_gc(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        if info["generation"] != 2:
            return
        if phase == "start":
            started = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - started)

    gc.callbacks.append(on_gc)
    try:
        yield
    finally:
        gc.callbacks.remove(on_gc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.allocator",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--profile", action="store_true",
                        help="afterwards, print cProfile's hottest functions of Allocator.step "
                             "and of the Step handler (not timed, not written)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    out_md, out_png = output_paths(args, "allocator_bench.png")

    results = Results(sizes.num_blocks, sizes.block_size, sizes.batch,
                      load_at_start=os.getloadavg()[0])
    bench_core_mix(sizes, results)
    bench_pool_append(sizes, results)
    with allocator_server() as address:
        channel = connect(address)
        bench_batched_vs_per_op(sizes, channel, results)
        bench_step_latency(sizes, channel, results)
        channel.close()

    print(text_table(result_rows(results)))
    if out_png is not None:
        write_plot(results, out_png)
        print(f"plot: {out_png}")
    if out_md is not None:
        replace_section(out_md, "Allocator", section_body(results, out_png, out_md))
        print(f"results: {out_md} (## Allocator)")
    if args.profile:
        from bench.allocator.profile import profile_hot_paths
        profile_hot_paths(sizes.num_blocks, sizes.block_size, sizes.batch,
                          warmup_steps=sizes.mix_warmup_steps, steps=50 if args.quick else 300)


if __name__ == "__main__":
    sys.exit(main())
