"""Replays recorded Step streams at their original pace: the load of N executors on one
allocator, from one cheap driver process.

Executor k plays stream k mod len(streams) under its own id (`replay-k`), starting at a random
moment in the first `spread_s` seconds so copies of one stream do not move in step. Like the
executor's client, a stream has one Step in flight at a time: Step i goes out at its recorded
offset, or as soon as Step i-1 is answered if that came later. Every request is pre-serialized
(a fresh header before the recorded ops, step_stream.py) and every answer is compared byte for
byte with the recorded one.

A Step is late (a stall) when it was overlapped in the recording (the executor computed while
it was in flight) and its answer took longer than its slack: until the executor read it, after
that forward pass and its sampling. Latency and stalls count only inside the measured window
(after `warmup_s`, when every executor has started and filled its batch); so does the
allocator's CPU time, read from /proc.

Steps go over the allocator's Step channel (one connection per replayed executor, the frames
of pagedserve/protocol/step_frames.py) when its registration names one, as the executor's
client does; `--transport grpc` sends them as Step RPCs instead, to measure that path.

An allocator group is replayed the same way: `--target` lists its shards and
`--allocator-pid` their processes, and executor `replay-k` registers with the shard its index k
gives it, as the k-th executor of `pagedserve up` does (pagedserve/common/allocator_shards.py).
Each shard's CPU time is kept apart.

    python -m bench.fleet.replay --target HOST:PORT --allocator-pid PID --executors 32 \\
        --out result.json sim-0.stream sim-1.stream
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from bench.fleet.step_stream import StepStream, step_body
from bench.serve.stack import cpu_seconds, stolen_seconds
from executor_service.step_channel_client import target_host
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.allocator_shards import balanced_owners, parse_allocator_group
from pagedserve.protocol.step_frames import FrameReader, frame, hello_frame, reply_body

TRANSPORTS = ("channel", "grpc")
STEP_METHOD = "/pagedserve.allocator.v1.Allocator/Step"
REGISTER_METHOD = "/pagedserve.allocator.v1.Allocator/RegisterExecutor"
# An answer this much past its slack is still on time (the driver's own scheduling jitter).
LATE_AFTER_S = 0.001


@dataclass(slots=True)
class ReplayResult:
    executors: int
    window_s: float
    steps: int = 0
    ops: int = 0
    stalls: int = 0
    # Answers that differ from the recorded ones (must be 0: the replay is then exact).
    mismatches: int = 0
    # Steps sent later than their recorded offset by more than a forward pass, because the
    # Step before them was answered late (the executor would have slowed down).
    behind: int = 0
    # Seconds the executors would have waited on Steps their forward pass needed first.
    blocking_wait_s: float = 0.0
    allocator_cpu_s: float | None = None
    # Per shard of an allocator group, in --target order: its address, CPU seconds and
    # executors.
    shard_targets: list[str] = field(default_factory=list)
    shard_cpu_s: list[float] = field(default_factory=list)
    shard_executors: list[int] = field(default_factory=list)
    driver_cpu_s: float = 0.0
    # CPU time the host took from this machine in the window, all cores together (None: not
    # measured). On a shared host the 5 ms stalls come with it (architecture.md).
    stolen_s: float | None = None
    latencies_ms: list[float] = field(default_factory=list)
    # When each stall's Step went out, in seconds into the window: one pause of the host
    # makes a burst of them, a load the allocator cannot carry spreads them out.
    stalled_at_s: list[float] = field(default_factory=list)
    # Replayed executors whose Steps went over the Step channel (the others used the RPC).
    channel_executors: int = 0


def stall_bursts(stalled_at_s: Sequence[float], gap_s: float = 0.1) -> int:
    """How many bursts the stalls came in: a stall within `gap_s` of the one before joins its
    burst. At 5 ms on a shared host, one pause of the allocator's or the driver's process (the
    host taking its core away) makes a burst of every Step in flight."""
    moments = sorted(stalled_at_s)
    return sum(1 for before, at in zip([-math.inf, *moments], moments) if at - before > gap_s)


class Window:
    """The measured interval, on the event loop's clock."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def holds(self, moment: float) -> bool:
        return self.start <= moment < self.end


class ChannelSteps(asyncio.Protocol):
    """One replayed executor's connection to the Step channel. An answer is timed when its
    bytes are read, in the loop's callback for the socket, as the executor's own call thread
    would wake on them: not when the awaiting coroutine resumes, which on a driver playing a
    hundred executors can be a few hundred microseconds later, behind the other answers that
    arrived in the same turn."""

    def __init__(self) -> None:
        self.frames = FrameReader()
        self.transport: asyncio.Transport
        self._loop = asyncio.get_running_loop()
        self._waiting: asyncio.Future[tuple[bytes, float]] | None = None

    @classmethod
    async def open(cls, host: str, port: int, executor_id: str) -> ChannelSteps:
        _, steps = await asyncio.get_running_loop().create_connection(cls, host, port)
        await steps.send(hello_frame(executor_id))
        return steps

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        answered_at = self._loop.time()
        for payload in self.frames.feed(data):
            waiting, self._waiting = self._waiting, None
            if waiting is not None and not waiting.done():
                waiting.set_result((payload, answered_at))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_exception(exc or ConnectionError("the Step channel closed"))

    async def __call__(self, body: bytes) -> tuple[bytes, float]:
        return await self.send(frame(body))

    async def send(self, data: bytes) -> tuple[bytes, float]:
        """Writes `data` and waits for the one reply (the client has one Step in flight)."""
        self._waiting = self._loop.create_future()
        self.transport.write(data)
        payload, answered_at = await self._waiting
        return reply_body(payload), answered_at

    async def close(self) -> None:
        self.transport.close()


class RpcSteps:
    """Step RPCs, bytes in and bytes out; an answer is timed when the call returns."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = channel.unary_unary(STEP_METHOD)

    async def __call__(self, body: bytes) -> tuple[bytes, float]:
        answer = await self.call(body)
        return answer, asyncio.get_running_loop().time()


async def play(channel: grpc.aio.Channel, target: str, stream: StepStream, executor_id: str,
               start: float, window: Window, result: ReplayResult,
               transport: str = "channel") -> None:
    register = channel.unary_unary(REGISTER_METHOD,
                                   request_serializer=pb.RegisterExecutorRequest.SerializeToString,
                                   response_deserializer=pb.RegisterExecutorResponse.FromString)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - loop.time()))
    registered = await register(stream.register_request(executor_id))
    epoch = registered.epoch
    step: ChannelSteps | RpcSteps
    if transport == "channel" and registered.step_channel_port:
        step = await ChannelSteps.open(target_host(target), registered.step_channel_port,
                                       executor_id)
        result.channel_executors += 1
    else:
        step = RpcSteps(channel)
    try:
        await play_steps(step, stream, executor_id, epoch, window, result)
    finally:
        if isinstance(step, ChannelSteps):
            await step.close()


async def play_steps(step: Callable[[bytes], Awaitable[tuple[bytes, float]]],
                     stream: StepStream, executor_id: str, epoch: int, window: Window,
                     result: ReplayResult) -> None:
    """`step` sends a Step's bytes and gives its answer's bytes and when they arrived."""
    loop = asyncio.get_running_loop()
    begun = loop.time()
    for step_id, recorded in enumerate(stream.steps, start=1):
        due = begun + recorded.offset_s
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        sent = loop.time()
        if sent >= window.end:
            return
        answer, answered_at = await step(step_body(executor_id, epoch, step_id, recorded.ops))
        latency = answered_at - sent
        if not window.holds(sent):
            continue
        result.steps += 1
        result.ops += recorded.num_ops
        result.latencies_ms.append(latency * 1000)
        result.mismatches += answer != recorded.reply
        if recorded.slack_s > 0:
            if latency > recorded.slack_s + LATE_AFTER_S:
                result.stalls += 1
                result.stalled_at_s.append(sent - window.start)
        else:
            result.blocking_wait_s += latency
        result.behind += sent - due > stream.iteration_s


async def replay(shards: Sequence[str], streams: list[StepStream], executors: int, *,
                 warmup_s: float, measure_s: float, spread_s: float,
                 allocator_pids: Sequence[int] = (), seed: int = 0,
                 transport: str = "channel") -> ReplayResult:
    """`shards`: the allocator, or every shard of a group; `allocator_pids`: their processes,
    in the same order (none: no CPU figures); `transport`: "channel" (the Step channel where
    the allocator has one) or "grpc"."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    now = loop.time()
    window = Window(now + warmup_s, now + warmup_s + measure_s)
    result = ReplayResult(executors, measure_s)
    ids = [replayed_executor_id(k) for k in range(executors)]
    owners = [shards.index(shard) for shard in balanced_owners(executors, shards)]
    result.shard_targets = list(shards)
    result.shard_executors = [owners.count(index) for index in range(len(shards))]
    # A few channels per shard: one HTTP/2 connection would serialize every stream's frames.
    channels = [[grpc.aio.insecure_channel(shard) for _ in range(max(1, min(8, count)))]
                for shard, count in zip(shards, result.shard_executors)]
    tasks = [play(channels[owner][k % len(channels[owner])], shards[owner],
                  streams[k % len(streams)], ids[k], now + rng.uniform(0, spread_s), window,
                  result, transport)
             for k, owner in enumerate(owners)]
    gathered = asyncio.gather(*tasks)
    await sleep_until(window.start)
    allocator_start = [cpu_seconds(pid) for pid in allocator_pids]
    driver_start = time.process_time()
    stolen_start = stolen_seconds()
    await sleep_until(window.end)
    stolen_end = stolen_seconds()
    if stolen_start is not None and stolen_end is not None:
        result.stolen_s = stolen_end - stolen_start
    if allocator_pids:
        result.shard_cpu_s = [cpu_seconds(pid) - start
                              for pid, start in zip(allocator_pids, allocator_start)]
        result.allocator_cpu_s = sum(result.shard_cpu_s)
    result.driver_cpu_s = time.process_time() - driver_start
    await gathered
    for shard_channels in channels:
        for channel in shard_channels:
            await channel.close()
    return result


def replayed_executor_id(k: int) -> str:
    return f"replay-{k}"


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - asyncio.get_running_loop().time()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", nargs="+", type=Path)
    parser.add_argument("--target", required=True,
                        help="the allocator's HOST:PORT, or a group's, comma-separated")
    parser.add_argument("--executors", type=int, required=True)
    parser.add_argument("--allocator-pid", default="",
                        help="the allocator's process id (a group's, comma-separated, in "
                             "--target order) for its CPU time")
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--measure-s", type=float, default=20.0)
    parser.add_argument("--spread-s", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transport", choices=TRANSPORTS, default="channel",
                        help="how Steps travel: the allocator's Step channel (where it has "
                             "one), or Step RPCs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    streams = [StepStream.load(path) for path in args.streams]
    # The recorded streams are a few hundred thousand long-lived objects: without this, the
    # driver's own full collections pause its event loop and show up as late answers.
    gc.freeze()
    result = asyncio.run(replay(
        parse_allocator_group(args.target), streams, args.executors, warmup_s=args.warmup_s,
        measure_s=args.measure_s, spread_s=args.spread_s,
        allocator_pids=[int(pid) for pid in args.allocator_pid.split(",") if pid],
        seed=args.seed, transport=args.transport))
    args.out.write_text(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
