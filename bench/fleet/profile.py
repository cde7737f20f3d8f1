"""`python -m bench.fleet.profile`: where an allocator's CPU goes on a Step, measured in process.

The replay (replay.py) measures a real allocator process from outside. This plays the same
recorded streams through the allocator's own Step path in this process, the executors' Steps
interleaved as they arrive at a server, and times each stage apart:

    decode     the Step channel's wire reader: the request's header and ops (step_wire.py)
    digest     the request bytes' hash (its retry identity)
    core       Allocator.step: validation, every op, and the answer's bytes (kept for retries)
    commit     the in-memory store taking the Step's KV events
    encode     the answer's bytes where the core kept none (a retry's)

`--protobuf` times the path through protobuf objects instead (the Step RPC's, and the Step
channel's before 2026-11-28): parse (StepRequest.FromString), convert (ops_from_proto), digest
(the deterministic serialization and its hash), core, commit, encode (step_result_to_proto and
its serialization).

It runs the streams twice on fresh allocators, the cyclic garbage collector off and then on
(pools frozen after registration, collections on the server's schedule, server/heap.py); the
difference is what collection costs. In process the Steps run back to back, faster than a fleet
sends them, so each timed collection finds more to walk and there are fewer of them.

What a replay measures beyond the sum is gRPC's own work per call. Every answer is compared with
the recorded one. Prints a table; writes nothing.

    .venv/bin/python -m bench.fleet.profile                  # records 2 streams first (30 s)
    .venv/bin/python -m bench.fleet.profile --copies 8 sim-0.stream sim-1.stream
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from allocator_service.core.allocator import Allocator
from allocator_service.core.step_wire import decode_step_request, encode_step_response
from allocator_service.durability import commands
from allocator_service.durability.state_store import MemoryStore
from allocator_service.server.heap import CollectionSchedule
from bench.fleet.capacity import Timing, record
from bench.fleet.step_stream import StepStream, step_body
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_codec import ops_from_proto, step_result_to_proto

WIRE_STAGES = ("decode", "digest", "core", "commit", "encode")
PROTOBUF_STAGES = ("parse", "convert", "digest", "core", "commit", "encode")
STAGES = ("decode", "parse", "convert", "digest", "core", "commit", "encode")


@dataclass(slots=True)
class StageTimes:
    steps: int = 0
    ops: int = 0
    mismatches: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    # Each Step's time through every stage, in the order played.
    per_step_s: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


def play(streams: list[StepStream], copies: int, collect: bool, protobuf: bool = False
         ) -> StageTimes:
    """Every stream `copies` times, each under its own executor id, Steps interleaved."""
    core, store = Allocator(lease_ttl_s=600.0), MemoryStore()
    plays = []
    for copy in range(copies):
        for index, stream in enumerate(streams):
            executor_id = f"profile-{copy}-{index}"
            registration = stream.register_request(executor_id)
            epoch = core.register_executor(
                executor_id, registration.address, registration.num_blocks,
                registration.block_size, registration.model_fingerprint).epoch
            plays.append([(step_body(executor_id, epoch, step_id, recorded.ops), recorded.reply)
                          for step_id, recorded in enumerate(stream.steps, start=1)])
    core.events.take()
    longest = max(len(steps) for steps in plays)
    arrivals = [steps[i] for i in range(longest) for steps in plays if i < len(steps)]
    gc.collect()
    gc.freeze()
    # As the server collects (server/heap.py), or not at all.
    schedule = CollectionSchedule().start() if collect else None
    if not collect:
        gc.disable()
    times = StageTimes()
    seconds, clock = times.seconds, time.perf_counter
    try:
        for body, reply in arrivals:
            laps = Laps(seconds, clock)
            answer, ops = (_through_protobuf if protobuf else _through_the_wire_reader)(
                core, store, body, laps)
            times.per_step_s.append(laps.total())
            times.steps += 1
            times.ops += ops
            times.mismatches += answer != reply
    finally:
        if schedule is not None:
            schedule.stop()
        gc.enable()
        gc.unfreeze()
    return times


class Laps:
    """One Step's stopwatch: each lap's time goes to its stage."""

    def __init__(self, seconds: dict[str, float], clock: Callable[[], float]) -> None:
        self.seconds, self.clock = seconds, clock
        self.started = self.last = clock()

    def lap(self, stage: str) -> None:
        now = self.clock()
        self.seconds[stage] += now - self.last
        self.last = now

    def total(self) -> float:
        return self.last - self.started


def _through_the_wire_reader(core: Allocator, store: MemoryStore, body: bytes,
                             laps: Laps) -> tuple[bytes, int]:
    """One Step as the Step channel takes it; its answer and number of ops."""
    step = decode_step_request(body)
    assert step is not None, "a recorded Step the wire reader leaves to protobuf"
    laps.lap("decode")
    digest = commands.step_digest(step.body)
    laps.lap("digest")
    result = core.step(step.executor_id, step.epoch, step.step_id, step.ops, digest)
    laps.lap("core")
    store.commit(core, commands.step(body), core.events.take())
    laps.lap("commit")
    # As the Step channel writes it: the bytes the core kept for retries (its encoding is in
    # "core" now), else encoded here.
    answer = result.encoded or encode_step_response(result)
    laps.lap("encode")
    return answer, len(step.ops)


def _through_protobuf(core: Allocator, store: MemoryStore, body: bytes,
                      laps: Laps) -> tuple[bytes, int]:
    """One Step through protobuf objects, as the Step RPC takes it."""
    request = pb.StepRequest.FromString(body)
    laps.lap("parse")
    ops = ops_from_proto(request.ops)
    laps.lap("convert")
    digest = commands.step_digest(request.SerializeToString(deterministic=True))
    laps.lap("digest")
    result = core.step(request.executor_id, request.epoch, request.step_id, ops, digest)
    laps.lap("core")
    store.commit(core, commands.step(body), core.events.take())
    laps.lap("commit")
    answer = step_result_to_proto(result).SerializeToString()
    laps.lap("encode")
    return answer, len(ops)


def cost_per_executor_second(paths: list[Path], copies: int = 8) -> float:
    """Seconds of the Step path, in process with the collector off, per executor-second of the
    recorded streams at `paths` played `copies` times each. The same code on the same streams
    costs the same on the same machine: a report gives it so that a slower host can be told
    from slower code."""
    streams = [StepStream.load(path) for path in paths]
    return play(streams, copies, collect=False).total_s / executor_seconds(streams, copies)


def executor_seconds(streams: list[StepStream], copies: int) -> float:
    """How long the executors behind `copies` plays of each stream served, together."""
    return sum(stream.duration_s for stream in streams) * copies


def rows(off: StageTimes, on: StageTimes, served_s: float) -> list[list[str]]:
    """Per stage: microseconds per op and milliseconds per executor-second."""
    def line(name: str, seconds: float) -> list[str]:
        return [name, f"{seconds / off.ops * 1e6:.2f}", f"{seconds / served_s * 1e3:.2f}"]

    table = [["stage", "µs per op", "ms per executor-second"]]
    table += [line(stage, off.seconds[stage]) for stage in STAGES if off.seconds[stage]]
    table.append(line("garbage collection", max(0.0, on.total_s - off.total_s)))
    table.append(line("total in process", on.total_s))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", nargs="*", type=Path,
                        help="recorded streams (default: record 2 at --iteration-ms)")
    parser.add_argument("--copies", type=int, default=8,
                        help="executors per stream (8 × 2 streams: a 16-executor allocator)")
    parser.add_argument("--iteration-ms", type=float, default=20.0)
    parser.add_argument("--record-s", type=float, default=30.0)
    parser.add_argument("--reserve-blocks", type=int, default=4,
                        help="the recording executors' --reserve-blocks (as bench.fleet's)")
    parser.add_argument("--protobuf", action="store_true",
                        help="time the path through protobuf objects (the Step RPC's)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fleet-profile-") as scratch:
        paths = args.streams or record(Path(scratch), args.iteration_ms, 2,
                                       Timing(record_s=args.record_s), 256, 4,
                                       args.reserve_blocks)[0]
        streams = [StepStream.load(path) for path in paths]
    off = play(streams, args.copies, collect=False, protobuf=args.protobuf)
    on = play(streams, args.copies, collect=True, protobuf=args.protobuf)
    served_s = executor_seconds(streams, args.copies)
    print(f"{len(streams) * args.copies} executors, {off.steps} Steps, {off.ops} ops "
          f"({off.ops / off.steps:.1f} per Step), {served_s:.0f} executor-seconds; "
          f"answers differing from the recording: {off.mismatches + on.mismatches}")
    table = rows(off, on, served_s)
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        print(row[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in
                                         zip(row[1:], widths[1:])))
    return 0 if off.mismatches + on.mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
