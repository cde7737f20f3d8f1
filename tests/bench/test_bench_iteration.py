"""The iteration benchmark: its --quick mode runs, prints its tables and writes only what it is told
to; and how probe.py cuts an iteration into phases (no timings are asserted: the machine is shared
and noisy)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.iteration.probe import (FORWARD, MIRROR, OUTPUT, PHASES, PLAN, PREP, SAMPLING, STEP,
                                   Recorder)
from tests.support.bench_runs import BENCH_ENV

ROOT = Path(__file__).resolve().parents[2]
PHASE_ROWS = ("plan (`scheduler.plan`)", "Step (ops built, `allocator.submit`, `result()`)",
              "mirror the answer (`scheduler.apply`)",
              "input preparation (rest of `runner.execute`)", "forward (model and LM head)",
              "sampling (rows, `sampler.sample`)",
              "output handling (tokens recorded, `outputs.drain`)",
              "total: one `engine.step()`", "host time outside the forward",
              "allocator ops per iteration", "Steps per iteration")


def run_quick(cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.iteration", "--quick", *flags], cwd=cwd,
                          env=BENCH_ENV, capture_output=True, text=True, timeout=120)


def test_iteration_bench_quick_run_prints_its_tables_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = run_quick(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "batch 1:" in run.stdout and "batch 4:" in run.stdout
    for row in PHASE_ROWS:
        assert row in run.stdout
    summary = [line.split() for line in run.stdout.splitlines()
               if line.split()[:1] in (["1"], ["4"])
               and line.split()[1:2] in (["per-token"], ["sparse"])]
    # batch, contender, ..., ops / iteration, Steps / iteration, stalls, preemptions: the
    # per-token protocol sends one Append per decoding sequence per iteration, sparse Steps at
    # most that, and nothing is preempted.
    assert sorted((row[0], row[1], row[-1]) for row in summary) == [
        ("1", "per-token", "0"), ("1", "sparse", "0"), ("4", "per-token", "0"),
        ("4", "sparse", "0")], summary
    assert all(float(row[-4]) == int(row[0]) for row in summary if row[1] == "per-token")
    assert all(float(row[-4]) <= int(row[0]) for row in summary if row[1] == "sparse")
    for sanity in ("runs whose every sequence decoded through the timed iterations",
                   "runs that timed 5 iterations", "preemptions in timed iterations"):
        line = next(line for line in run.stdout.splitlines() if line.startswith(sanity))
        assert line.split()[-1] == "yes", line
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


def test_iteration_bench_quick_run_writes_its_section_plot_and_raw_results_when_told(
        tmp_path: Path) -> None:
    run = run_quick(tmp_path, "--contenders", "sparse", "--out-md", "out/bench.md",
                    "--out-png", "out/iteration.png", "--results-dir", "raw")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    page = (tmp_path / "out" / "bench.md").read_text()
    assert "\n## Iteration\n" in page
    assert "[Iteration: how it is measured](#iteration-how-it-is-measured)" in page
    assert "Command: `.venv/bin/python -m bench.iteration --quick --contenders sparse" in page
    assert "Batch 1:" in page and "Batch 4:" in page
    assert "**total: one `engine.step()`**" in page
    assert "![iteration benchmark](iteration.png)" in page
    assert (tmp_path / "out" / "iteration.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    raw = json.loads((tmp_path / "raw" / "iteration_bench.json").read_text())
    assert raw["contenders"] == {"sparse": {}}
    assert sorted(entry["batch"] for entry in raw["runs"]) == [1, 4]
    for entry in raw["runs"]:
        for iteration in entry["rounds"][0]["iterations"]:
            assert sum(iteration[phase] for phase in raw["phases"]) == iteration["total_ns"]


class FakeClock:
    """perf_counter_ns that moves only when told."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def test_probe_cuts_an_iteration_into_contiguous_phases() -> None:
    """A step shaped like Engine.step's lookahead path (the forward pass while the Step is in
    flight): each wrapped call's phase gets its own time and the gap before it, the forward
    comes out of execute, what follows the last call is output handling, and a Step sent while
    mirroring (a preemption) counts its ops but its time stays the mirror's."""
    clock = FakeClock()
    recorder = Recorder(now=clock)

    class Handle:
        def result(self) -> str:
            clock.advance(3)
            return "answer"

    def execute() -> None:
        clock.advance(7)                     # input tensors built
        forward()

    def apply(result: str) -> None:
        submit(["free", "append"]).result()

    plan = recorder.timed(PLAN, lambda: clock.advance(5))
    submit = recorder.submit(lambda ops: Handle())
    forward = recorder.forward(lambda: clock.advance(100))
    execute = recorder.timed("execute", execute)
    apply = recorder.timed(MIRROR, apply)
    sample = recorder.timed(SAMPLING, lambda: None)
    drain = recorder.timed(OUTPUT, lambda: [])

    def step() -> list:
        plan()
        clock.advance(2)                     # plan.block_ops()
        handle = submit(["append"])
        execute()
        apply(handle.result())
        clock.advance(4)                     # the sampler's rows built
        sample()
        clock.advance(6)                     # tokens recorded
        return drain()

    assert recorder.iteration(step)() == []
    [iteration] = recorder.iterations
    assert (iteration.ops, iteration.steps, iteration.total_ns) == (3, 2, 130)
    assert iteration.phase_ns == {PLAN: 5, STEP: 2 + 3, MIRROR: 3, PREP: 7, FORWARD: 100,
                                  SAMPLING: 4, OUTPUT: 6}
    assert list(iteration.phase_ns) == list(PHASES)


def test_measure_batch_times_steady_decode_and_leaves_the_engine_as_it_was() -> None:
    from allocator_service.local_block_allocator import LocalBlockAllocator
    from bench.iteration.run import measure_batch
    from bench.iteration.workload import QUICK, draw_prompts
    from bench.throughput.workload import ordinary_token_ids
    from executor_service.engine.build import EngineOptions, build_engine
    from executor_service.model.embedded import embedded_model_dir

    model_dir = embedded_model_dir()
    allocator = LocalBlockAllocator()
    engine = build_engine(model_dir, EngineOptions(num_blocks=64), allocator)
    model = engine.runner.model
    prompts = draw_prompts(QUICK, 3, ordinary_token_ids(model_dir))
    run = measure_batch(engine, prompts, QUICK, "probe-test")
    assert len(run.iterations) == QUICK.iterations
    assert (run.decoding, run.preemptions) == (3, 0)
    for iteration in run.iterations:
        assert sum(iteration.phase_ns.values()) == iteration.total_ns
        assert iteration.phase_ns[FORWARD] > 0
        # Sparse Steps: an iteration sends a Step only when some sequence must append.
        assert iteration.steps == (iteration.ops > 0) and iteration.ops <= 3
    # The wrappers are gone: the classes' methods again, the runner's own model, and the batch
    # aborted and freed.
    for instance, name in ((engine, "step"), (engine.scheduler, "plan"),
                           (engine.scheduler, "apply"), (allocator, "submit"),
                           (engine.runner, "execute"), (engine.sampler, "sample"),
                           (engine.outputs, "drain")):
        assert name not in vars(instance)
    assert engine.runner.model is model
    assert not engine.requests and not engine.has_work()
