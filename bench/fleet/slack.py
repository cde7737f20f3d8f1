"""How long the recorded executors' overlapped Steps could take: from when each went out to
when the engine read its answer.

A simulated executor sends its Step once it has sampled the last pass's tokens, reported them
and planned the next iteration. A Step of decoding sequences is read just before the next Step
goes out (with coalesced Steps, several iterations later) or before a pass that writes a slot
it grants; any other once the next pass's tokens are sampled, so its slack is the iteration
time less the executor's own CPU between the pass's end and the Step. A replayed Step stalls
when its answer takes more than its slack plus 1 ms (replay.py), so at short iterations on a
slow host the executor's CPU, not the allocator's load, can decide the stalls: at 5 ms on this
2-core host, when the answer was read at the pass's end, two in five overlapped Steps had
under 2 ms (2026-11-28, architecture.md). A sweep reports it beside its stalls, so a reader can
tell the two apart.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bench.fleet.step_stream import StepStream
from bench.report import percentile

# A Step with less slack than this stalls when its answer takes 3 ms (the driver's 1 ms of
# grace included): the replays' p99 at low load on this host.
LITTLE_SLACK_S = 0.002


@dataclass(frozen=True, slots=True)
class Slack:
    overlapped: int          # Steps sent while a pass ran (the others the pass waited for)
    p50_s: float
    p10_s: float
    little: float            # share of the overlapped Steps with under LITTLE_SLACK_S


def slack_of(streams: Iterable[StepStream]) -> Slack:
    slacks = [step.slack_s for stream in streams for step in stream.steps if step.slack_s > 0]
    if not slacks:
        return Slack(0, 0.0, 0.0, 0.0)
    return Slack(len(slacks), percentile(slacks, 50), percentile(slacks, 10),
                 sum(s < LITTLE_SLACK_S for s in slacks) / len(slacks))
