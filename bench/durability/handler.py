"""Where the durable Step's time goes: the servicer's Step handler in this process, on MemoryStore
and on RedisStore, with the store's commit (the journal write before the reply) timed inside it.

Over gRPC the allocators' numbers include the transport; here the same ops go straight into
`AllocatorServicer.Step`, so the difference between the stores is the commit and what it costs
around it. `--profile` prints cProfile's view of the durable handler (not timed, not written).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from allocator_service.core.allocator import Allocator
from allocator_service.durability.redis_store import RedisStore
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import MemoryStore, StateStore
from allocator_service.server.allocator_servicer import AllocatorServicer
from bench.durability.config import LEASE_TTL, NO_SNAPSHOTS, TARGET_BATCH, Sizes
from bench.durability.latency import Target, rotated
from bench.durability.report import Results
from bench.load.allocator_rpc import step_request
from bench.load.allocator_workload import DecodeBatch, ServingMix
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_ops import BlockOp

# The two workloads of the in-process measurement.
DECODE = f"decode, {TARGET_BATCH} appends"
MIX = "serving mix"


def in_process_store(target: Target, db: int) -> StateStore:
    """The target's kind of store, in this process; a durable one on a database of its own of
    the target's redis-server, so it shares that server's fsync policy but not its keys."""
    if target.redis is None:
        return MemoryStore()
    return RedisStore(target.redis.url_for_db(db), snapshot_every=NO_SNAPSHOTS)


def timed_commits(store: StateStore, sink: list[float]) -> None:
    """Records the duration of every store.commit (the journal write before the reply)."""
    commit = store.commit

    def timed(*args: object) -> None:
        start = time.perf_counter()
        try:
            commit(*args)  # type: ignore[arg-type]
        finally:
            sink.append(time.perf_counter() - start)

    store.commit = timed  # type: ignore[method-assign]


@dataclass(slots=True)
class InProcess:
    """A servicer on one store, with one registered pool, driven by the benchmark directly."""
    store: StateStore
    core: Allocator
    servicer: AllocatorServicer
    epoch: int
    step_id: int = 0

    def request(self, ops: Sequence[BlockOp]) -> pb.StepRequest:
        self.step_id += 1
        return step_request("handler", self.epoch, self.step_id, ops)


def in_process(store: StateStore, sizes: Sizes) -> InProcess:
    # Registered through the servicer, not the core (allocator_rpc.local_allocator), so that
    # the registration is journaled like the server's.
    core = Allocator(lease_ttl_s=float(LEASE_TTL))
    store.load(core)
    servicer = AllocatorServicer(AllocatorState(core, store))
    epoch = servicer.RegisterExecutor(pb.RegisterExecutorRequest(
        executor_id="handler", address="127.0.0.1:0", num_blocks=sizes.num_blocks,
        block_size=sizes.block_size, model_fingerprint="bench"), None).epoch  # type: ignore[arg-type]
    return InProcess(store, core, servicer, epoch)


def bench_handler(sizes: Sizes, targets: list[Target], results: Results, workload: str,
                  first_ops: Sequence[BlockOp] | None, next_ops: Callable[[], list[BlockOp]],
                  warmup_steps: int, steps: int) -> None:
    """AllocatorServicer.Step in this process on MemoryStore and on RedisStore against the two
    Redis servers (a database of their own), the same ops to each, interleaved; the store's
    commit inside it is timed too. The request is built before the clock starts."""
    handlers, commits = [], []
    for target in targets:
        commits.append([])
        store = in_process_store(target, db=len(results.handler) + 1)
        timed_commits(store, commits[-1])
        handlers.append(in_process(store, sizes))
    handler_s: dict[str, list[float]] = {t.config.name: [] for t in targets}
    commit_s: dict[str, list[float]] = {t.config.name: [] for t in targets}
    num_events = num_bytes = 0
    try:
        for handler in handlers:
            if first_ops is not None:
                handler.servicer.Step(handler.request(first_ops), None)  # type: ignore[arg-type]
        events_before = handlers[0].core.events.last_seq
        for step in tqdm(range(warmup_steps + steps), desc=f"handler in-process, {workload}",
                         unit="step", leave=False):
            if step == warmup_steps:
                events_before = handlers[0].core.events.last_seq
            ops = next_ops()
            for index in rotated(len(targets), step):
                handler = handlers[index]
                request = handler.request(ops)
                start = time.perf_counter()
                response = handler.servicer.Step(request, None)  # type: ignore[arg-type]
                elapsed = time.perf_counter() - start
                results.num_not_ok += sum(1 for r in response.results if r.status)
                if step >= warmup_steps:
                    name = targets[index].config.name
                    handler_s[name].append(elapsed)
                    commit_s[name].append(commits[index][-1])
                    if index == 0:
                        num_bytes += request.ByteSize()
        num_events = handlers[0].core.events.last_seq - events_before
    finally:
        for handler in handlers:
            handler.store.close()
    results.handler[workload] = handler_s
    results.commit[workload] = commit_s
    results.events_per_step[workload] = num_events / steps
    results.journal_bytes_per_step[workload] = num_bytes / steps


def bench_handlers(sizes: Sizes, targets: list[Target], results: Results) -> None:
    decode = DecodeBatch(TARGET_BATCH, seed=7)
    bench_handler(sizes, targets, results, DECODE, decode.allocations(), decode.next_appends,
                  sizes.latency_warmup_steps, sizes.handler_steps)
    mix = ServingMix(seed=3, max_running=TARGET_BATCH)
    bench_handler(sizes, targets, results, MIX, None, mix.next_step, sizes.mix_warmup_steps,
                  sizes.handler_steps)


def profile_durable_handler(sizes: Sizes, targets: list[Target], steps: int) -> None:
    """`--profile`: cProfile of the Step handler on RedisStore, each durable configuration,
    for both workloads (requests built before profiling starts)."""
    from bench.allocator.profile import print_profile

    for target in targets:
        if target.redis is None:
            continue
        for workload in (DECODE, MIX):
            handler = in_process(in_process_store(target, db=9), sizes)
            try:
                if workload == DECODE:
                    decode = DecodeBatch(TARGET_BATCH, seed=8)
                    handler.servicer.Step(handler.request(decode.allocations()), None)  # type: ignore[arg-type]
                    next_ops = decode.next_appends
                else:
                    next_ops = ServingMix(seed=8, max_running=TARGET_BATCH).next_step
                for _ in range(Sizes().mix_warmup_steps if workload == MIX else 20):
                    handler.servicer.Step(handler.request(next_ops()), None)  # type: ignore[arg-type]
                requests = [handler.request(next_ops()) for _ in range(steps)]

                def run() -> None:
                    for request in requests:
                        handler.servicer.Step(request, None)  # type: ignore[arg-type]

                print_profile(f"Step handler, {workload}, RedisStore ({target.config.label}), "
                              f"{steps} steps", run, top=25)
            finally:
                handler.store.close()
