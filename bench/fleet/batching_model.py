"""`python -m bench.fleet.batching_model`: what answering a turn's Steps together costs in
Step latency, by a queueing model fed with Step times measured in process.

The Step channel applies the Steps that arrived in one turn of its event loop in the next turn
(allocator_service/server/step_channel.py). With Redis they are journaled in one commit, so no
reply can leave before the last of them has applied; in memory, each reply leaves as soon as its
Step applied. On a noisy 2-core machine a replay cannot tell the two apart reliably (its
latency moves by more from run to run), so this measures what it can in process, each recorded
Step's time through the allocator's Step path (profile.py), and plays it through one server:
Poisson arrivals at a given share of a core, the Steps that arrived while the server was busy
forming the next turn. Per load it prints Step latency p50 / p99 when a turn's replies leave
together and when each leaves after its own Step. It is a model (one core of the allocator's
own, no gRPC or kernel time, no collector); the replay measures the real thing.

    .venv/bin/python -m bench.fleet.batching_model sim-0.stream sim-1.stream
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from bench.fleet.profile import play
from bench.fleet.step_stream import StepStream
from bench.report import percentile

LOADS = (0.5, 0.6, 0.7, 0.8, 0.9)


def poisson_arrivals(service_s: list[float], load: float, count: int, seed: int = 0
                     ) -> list[tuple[float, float]]:
    """(arrival time, service time) of `count` Steps drawn from `service_s` at random,
    arriving as a Poisson process at `load` times the rate one core serves them."""
    rng = random.Random(seed)
    mean_s = sum(service_s) / len(service_s)
    arrivals, clock = [], 0.0
    for _ in range(count):
        clock += rng.expovariate(load / mean_s)
        arrivals.append((clock, rng.choice(service_s)))
    return arrivals


def latencies(arrivals: list[tuple[float, float]], together: bool) -> list[float]:
    """Each Step's time from arrival to reply on one server that takes, at the start of each
    turn, every Step that arrived while it was busy, and applies them in order. `together`:
    a turn's replies all leave when its last Step has applied (else each after its own)."""
    waited: list[float] = []
    now, first = 0.0, 0
    while first < len(arrivals):
        now = max(now, arrivals[first][0])
        last = first
        while last < len(arrivals) and arrivals[last][0] <= now:  # this turn's Steps
            last += 1
        done = []
        for arrived_at, service in arrivals[first:last]:
            now += service
            done.append(now - arrived_at)
        if together:  # every reply of the turn leaves when its last Step has applied
            done = [now - arrived_at for arrived_at, _ in arrivals[first:last]]
        waited += done
        first = last
    return waited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", nargs="+", type=Path, help="recorded streams (bench.fleet)")
    parser.add_argument("--copies", type=int, default=8, help="executors per stream")
    args = parser.parse_args(argv)
    streams = [StepStream.load(path) for path in args.streams]
    service_s = play(streams, args.copies, collect=False).per_step_s
    print(f"{len(service_s)} Steps measured in process: mean "
          f"{sum(service_s) / len(service_s) * 1e6:.0f} µs, p99 "
          f"{percentile(service_s, 99) * 1e6:.0f} µs")
    print("load  together p50 / p99 (ms)  one by one p50 / p99 (ms)")
    for load in LOADS:
        arrivals = poisson_arrivals(service_s, load, 20 * len(service_s))
        cells = []
        for together in (True, False):
            waited = latencies(arrivals, together)
            cells.append(f"{percentile(waited, 50) * 1e3:.2f} / {percentile(waited, 99) * 1e3:.2f}")
        print(f"{load:4.1f}  {cells[0]:>24}  {cells[1]:>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
