"""The three allocators side by side over gRPC: Step latency by batch size, and the serving mix's
throughput.

Each configuration runs as its own `python -m allocator_service` on loopback, each durable one
with a redis-server of its own. They get the same requests, one Step per allocator in turn, the
order rotating every step, so machine noise hits all three alike.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
from tqdm import tqdm

from allocator_service.durability import redis_codec
from bench.durability.config import CONFIGS, LEASE_TTL, NO_SNAPSHOTS, TARGET_BATCH, Config, Sizes
from bench.durability.report import Results
from bench.load.allocator_rpc import StepClient
from bench.load.allocator_workload import DecodeBatch, ServingMix
from pagedserve.supervisor.redis_server import RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess


@dataclass(slots=True)
class Target:
    config: Config
    allocator: AllocatorProcess
    channel: grpc.Channel
    redis: RedisProcess | None


def start_targets(stack: ExitStack, data_dir: Path, results: Results) -> list[Target]:
    """One allocator per configuration, stopped when `stack` closes. Snapshots are off: see
    NO_SNAPSHOTS."""
    targets = []
    for config in tqdm(CONFIGS, desc="starting allocators", leave=False):
        args = ["--lease-ttl", LEASE_TTL]
        redis_server = None
        if config.appendfsync is not None:
            redis_server = stack.enter_context(
                RedisProcess(data_dir / config.name, appendfsync=config.appendfsync))
            args += ["--state-url", redis_server.url, "--snapshot-every", str(NO_SNAPSHOTS)]
            results.redis_version = str(redis_server.client().info("server")["redis_version"])
        allocator = stack.enter_context(AllocatorProcess(*args))
        channel = allocator.channel()
        grpc.channel_ready_future(channel).result(timeout=15)
        targets.append(Target(config, allocator, channel, redis_server))
    return targets


def rotated(count: int, step: int) -> list[int]:
    """0..count-1 starting at step % count: every configuration goes first equally often."""
    first = step % count
    return list(range(first, count)) + list(range(first))


def bench_latency(sizes: Sizes, targets: list[Target], results: Results) -> None:
    """Decode steps of `batch` appends, one Step per allocator in turn; client-side time of the
    call alone (the request is built before the clock starts)."""
    for batch in sizes.batches:
        clients = [StepClient(t.channel, f"decode-{batch}", sizes.num_blocks, sizes.block_size)
                   for t in targets]
        work = [DecodeBatch(batch, seed=batch) for _ in targets]
        for client, decode in zip(clients, work):
            client.step(decode.allocations())
        samples: dict[str, list[float]] = {t.config.name: [] for t in targets}
        total = sizes.latency_warmup_steps + sizes.latency_steps
        for step in tqdm(range(total), desc=f"Step latency, {batch} appends", unit="step",
                         leave=False):
            for index in rotated(len(targets), step):
                client = clients[index]
                request = client.request(work[index].next_appends())
                start = time.perf_counter()
                response = client.stub.Step(request)
                elapsed = time.perf_counter() - start
                client.check(response)
                if step >= sizes.latency_warmup_steps:
                    samples[targets[index].config.name].append(elapsed)
        results.latency[batch] = samples
        results.num_not_ok += sum(client.num_not_ok for client in clients)


def bench_mix(sizes: Sizes, targets: list[Target], results: Results) -> None:
    """The same scheduler-shaped op stream to every allocator, step by step in turn; block ops
    per second of time spent in the Step call."""
    clients = [StepClient(t.channel, "mix", sizes.num_blocks, sizes.block_size)
               for t in targets]
    mix = ServingMix(seed=1, max_running=TARGET_BATCH)
    elapsed = [0.0] * len(targets)
    num_ops = 0
    total = sizes.mix_warmup_steps + sizes.mix_steps
    for step in tqdm(range(total), desc="serving mix", unit="step", leave=False):
        ops = mix.next_step()
        for index in rotated(len(targets), step):
            client = clients[index]
            request = client.request(ops)
            start = time.perf_counter()
            response = client.stub.Step(request)
            took = time.perf_counter() - start
            client.check(response)
            if step >= sizes.mix_warmup_steps:
                elapsed[index] += took
        if step >= sizes.mix_warmup_steps:
            num_ops += len(ops)
    for target, seconds in zip(targets, elapsed):
        results.mix_ops_s[target.config.name] = num_ops / seconds
    results.mix_ops_per_step = num_ops / sizes.mix_steps
    results.num_not_ok += sum(client.num_not_ok for client in clients)


def journaled(targets: list[Target], results: Results) -> None:
    """How many commands the durable allocators journaled, and whether one took a snapshot
    (it should not have: the report says so if one did)."""
    keys = redis_codec.Keys.under(redis_codec.DEFAULT_NAMESPACE)
    for target in targets:
        if target.redis is not None:
            client = target.redis.client()
            snapshot_seq = redis_codec.stored_snapshot_seq(client, keys)
            results.snapshot_during = max(results.snapshot_during, snapshot_seq)
            results.commands_journaled = max(results.commands_journaled,
                                             snapshot_seq + client.xlen(keys.journal))
