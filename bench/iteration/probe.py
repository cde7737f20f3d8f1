"""Timing one engine iteration phase by phase, from outside the engine.

The engine offers no hooks, so `probed(engine)` wraps, on the instances only, the calls an
iteration (`Engine.step`) makes, and restores them afterwards:

    engine.step                      the iteration, start to end
    engine.scheduler.plan            -> plan
    engine.allocator.submit          -> Step (and its ops counted); the handle it returns is
    handle.result                       wrapped too, its wait -> Step
    engine.scheduler.apply           -> mirror
    engine.runner.execute            -> input preparation, less what it spends in the model:
    engine.runner.model(...)            the forward pass and the LM head (`model.logits`)
    engine.runner.model.logits          -> forward
    engine.sampler.sample            -> sampling
    engine.outputs.drain             -> output

Each wrapped call leaves a (phase, start, end) event, in `time.perf_counter_ns`. The iteration
is cut at those events into contiguous pieces, so the phases add up to the iteration's time
exactly: the time between the end of one wrapped call and the start of the next belongs to the
next one's phase (`plan.block_ops()` before `submit` is Step's, building the sampler's rows
before `sampler.sample` is sampling's, recording each token and checking it for a stop before
`outputs.drain` is output handling's), and the time after the last call to output handling.
A wrapped call made inside another (a Step sent while mirroring, when a preemption makes room)
belongs to the outer one's phase; only its ops and its Step are counted.

Python's garbage collector runs wherever an allocation crosses its threshold, so its pauses land
in whichever phase allocated last; a `gc.callbacks` hook measures them apart, as `gc_ns` (already
inside the phases, not added to them).
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from executor_service.engine.engine import Engine

PLAN, STEP, MIRROR, PREP, FORWARD, SAMPLING, OUTPUT = (
    "plan", "Step", "mirror", "prep", "forward", "sampling", "output")
PHASES = (PLAN, STEP, MIRROR, PREP, FORWARD, SAMPLING, OUTPUT)
# The phase the time before a wrapped call goes to; execute's is input preparation.
EXECUTE = "execute"
LEAD_IN = {PLAN: PLAN, STEP: STEP, MIRROR: MIRROR, EXECUTE: PREP, SAMPLING: SAMPLING,
           OUTPUT: OUTPUT}


@dataclass(slots=True)
class Iteration:
    """One timed iteration: nanoseconds per phase (they add up to `total_ns`), the block ops it
    sent and in how many Steps, and the garbage collector's pauses inside it (part of the
    phases)."""
    total_ns: int
    phase_ns: dict[str, int]
    ops: int
    steps: int
    gc_ns: int = 0
    collections: int = 0


@dataclass(slots=True)
class Recorder:
    now: Callable[[], int] = time.perf_counter_ns
    # Top-level events of the iteration in progress, and the forward's pieces inside execute.
    events: list[tuple[str, int, int]] = field(default_factory=list)
    forward_ns: int = 0
    ops: int = 0
    steps: int = 0
    depth: int = 0
    gc_ns: int = 0
    collections: int = 0
    gc_started: int = 0
    iterations: list[Iteration] = field(default_factory=list)

    def timed(self, phase: str, call: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            if self.depth:
                return call(*args, **kwargs)
            self.depth += 1
            start = self.now()
            try:
                return call(*args, **kwargs)
            finally:
                self.events.append((phase, start, self.now()))
                self.depth -= 1
        return wrapper

    def forward(self, call: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = self.now()
            try:
                return call(*args, **kwargs)
            finally:
                self.forward_ns += self.now() - start
        return wrapper

    def submit(self, call: Callable) -> Callable:
        timed = self.timed(STEP, call)

        def wrapper(ops):
            ops = list(ops)
            self.ops += len(ops)
            self.steps += 1
            return TimedHandle(timed(ops), self.timed(STEP, lambda handle: handle.result()))
        return wrapper

    def iteration(self, step: Callable) -> Callable:
        def wrapper():
            self.events.clear()
            self.forward_ns = self.ops = self.steps = self.gc_ns = self.collections = 0
            start = self.now()
            outputs = step()
            end = self.now()
            self.iterations.append(Iteration(end - start, self.split(start, end), self.ops,
                                             self.steps, self.gc_ns, self.collections))
            return outputs
        return wrapper

    def collecting(self, phase: str, info: dict) -> None:
        """A gc.callbacks hook: each collection's pause."""
        if phase == "start":
            self.gc_started = self.now()
        else:
            self.gc_ns += self.now() - self.gc_started
            self.collections += 1

    def split(self, start: int, end: int) -> dict[str, int]:
        """The iteration cut into contiguous phases at its events (module docstring)."""
        phase_ns = dict.fromkeys(PHASES, 0)
        cursor = start
        for phase, begin, finish in sorted(self.events, key=lambda event: event[1]):
            phase_ns[LEAD_IN[phase]] += finish - cursor
            cursor = finish
        phase_ns[OUTPUT] += end - cursor
        # The model's time inside execute is the forward's, not input preparation's.
        phase_ns[PREP] -= self.forward_ns
        phase_ns[FORWARD] += self.forward_ns
        return phase_ns


class TimedHandle:
    """The allocator's handle, its `result()` timed."""

    __slots__ = ("_handle", "_result")

    def __init__(self, handle, result: Callable) -> None:
        self._handle, self._result = handle, result

    def result(self):
        return self._result(self._handle)


class TimedModel:
    """The runner's model, its call and its LM head timed; everything else passes through."""

    def __init__(self, model, recorder: Recorder) -> None:
        self._model = model
        self._call = recorder.forward(model)
        self.logits = recorder.forward(model.logits)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


@contextmanager
def probed(engine: Engine, recorder: Recorder) -> Iterator[Recorder]:
    """Every `engine.step()` inside records an Iteration in `recorder.iterations`."""
    scheduler, allocator, runner = engine.scheduler, engine.allocator, engine.runner
    model = runner.model
    engine.step = recorder.iteration(engine.step)
    scheduler.plan = recorder.timed(PLAN, scheduler.plan)
    allocator.submit = recorder.submit(allocator.submit)
    scheduler.apply = recorder.timed(MIRROR, scheduler.apply)
    runner.execute = recorder.timed(EXECUTE, runner.execute)
    runner.model = TimedModel(model, recorder)
    engine.sampler.sample = recorder.timed(SAMPLING, engine.sampler.sample)
    engine.outputs.drain = recorder.timed(OUTPUT, engine.outputs.drain)
    gc.callbacks.append(recorder.collecting)
    try:
        yield recorder
    finally:
        # The methods of the classes again (instance attributes shadowed them).
        del engine.step, scheduler.plan, allocator.submit, scheduler.apply, runner.execute
        del engine.sampler.sample, engine.outputs.drain
        runner.model = model
        gc.callbacks.remove(recorder.collecting)
