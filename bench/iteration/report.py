"""What the iteration benchmark records and reports: every run of every contender at every batch
size, the tables (terminal and markdown), the raw JSON and the `## Iteration` section of
docs/benchmarks.md. The plot is plot.py; how the benchmark measures is written once, by hand, in
docs/benchmarks.md (`## Iteration: how it is measured`)."""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.iteration.probe import (FORWARD, MIRROR, OUTPUT, PHASES, PLAN, PREP, SAMPLING, STEP,
                                   Iteration)
from bench.iteration.run import Run
from bench.iteration.workload import BASE_OPTIONS, Settings

PHASE_LABELS = {
    PLAN: "plan (`scheduler.plan`)",
    STEP: "Step (ops built, `allocator.submit`, `result()`)",
    MIRROR: "mirror the answer (`scheduler.apply`)",
    PREP: "input preparation (rest of `runner.execute`)",
    FORWARD: "forward (model and LM head)",
    SAMPLING: "sampling (rows, `sampler.sample`)",
    OUTPUT: "output handling (tokens recorded, `outputs.drain`)",
}
TOTAL = "total: one `engine.step()`"
HOST = "host time outside the forward"


@dataclass(slots=True)
class Results:
    settings: Settings
    model: str
    threads: int
    # Label -> EngineOptions overrides, in the order given; the first is the reference.
    contenders: dict[str, dict]
    # (batch size, label) -> one Run per round.
    runs: dict[tuple[int, str], list[Run]] = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        return list(self.contenders)

    def iterations(self, batch: int, label: str) -> list[Iteration]:
        return [iteration for run in self.runs[batch, label] for iteration in run.iterations]

    def series(self, batch: int, label: str, of: Callable[[Iteration], float]) -> list[float]:
        return [of(iteration) for iteration in self.iterations(batch, label)]

    def mean_ms(self, batch: int, label: str, phase: str) -> float:
        return statistics.fmean(self.series(batch, label, phase_of(phase))) / 1e6

    def median_ms(self, batch: int, label: str, phase: str) -> float:
        return statistics.median(self.series(batch, label, phase_of(phase))) / 1e6


def phase_of(phase: str) -> Callable[[Iteration], float]:
    """Nanoseconds of a phase, of the total or of the host time outside the forward."""
    if phase == TOTAL:
        return lambda iteration: iteration.total_ns
    if phase == HOST:
        return lambda iteration: iteration.total_ns - iteration.phase_ns[FORWARD]
    return lambda iteration: iteration.phase_ns[phase]


def plural(count: int) -> str:
    return "" if count == 1 else "s"


def ms(value_ns: float) -> str:
    return f"{value_ns / 1e6:.3f}"


def count(value: float) -> str:
    """A mean count: whole numbers as such, others to two places."""
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}"


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}×" if reference else "—"


def batch_grid(r: Results, batch: int, markdown: bool = False
               ) -> tuple[list[str], list[list[str]]]:
    """One batch size: phases down, each contender's median and mean across, ms per iteration;
    then the others' medians over the reference's. The total rows in bold on the page."""
    labels = r.labels
    header = ["ms per iteration"] + [f"{label}: {stat}" for label in labels
                                     for stat in ("median", "mean")]
    header += [f"{label} / {labels[0]} (median)" for label in labels[1:]]

    def row(name: str, of: Callable[[Iteration], float], shown: Callable[[float], str]
            ) -> list[str]:
        cells, medians = [name], []
        for label in labels:
            values = r.series(batch, label, of)
            medians.append(statistics.median(values))
            cells += [shown(medians[-1]), shown(statistics.fmean(values))]
        return cells + [ratio(median, medians[0]) for median in medians[1:]]

    rows = [row(PHASE_LABELS[phase], phase_of(phase), ms) for phase in PHASES]
    bold = "**" if markdown else ""
    rows.append(row(f"{bold}{TOTAL}{bold}", phase_of(TOTAL), ms))
    rows.append(row(f"{bold}{HOST}{bold}", phase_of(HOST), ms))
    host = phase_of(HOST)
    rows.append(row("host time outside the forward per sequence (µs)",
                    lambda iteration: host(iteration) / batch / 1e3, lambda v: f"{v:.1f}"))
    rows.append(row("of which garbage collection, inside the phases above",
                    lambda iteration: iteration.gc_ns, ms))
    rows.append(row("garbage collections per iteration",
                    lambda iteration: iteration.collections, count))
    rows.append(row("allocator ops per iteration", lambda iteration: iteration.ops, count))
    rows.append(row("Steps per iteration", lambda iteration: iteration.steps, count))
    rounds = ["total: median of each round"]
    for label in labels:
        rounds += [" / ".join(ms(statistics.median(i.total_ns for i in run.iterations))
                              for run in r.runs[batch, label]), ""]
    rows.append(rounds + [""] * (len(labels) - 1))
    return header, rows


def summary_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    """Every batch size and contender on one line each: medians per iteration (robust to a
    shared machine's slow spells), and the mean total."""
    header = ["batch", "contender", "total (ms)", "mean total (ms)", "forward (ms)",
              "outside the forward (ms)", "outside, share", "outside, per sequence (µs)",
              "ops / iteration", "Steps / iteration", "stalls", "preemptions"]
    rows = []
    for batch in r.settings.batch_sizes:
        for label in r.labels:
            total, forward, host = (r.median_ms(batch, label, phase)
                                    for phase in (TOTAL, FORWARD, HOST))
            iterations = r.iterations(batch, label)
            runs = r.runs[batch, label]
            rows.append([
                str(batch), label, f"{total:.3f}", f"{r.mean_ms(batch, label, TOTAL):.3f}",
                f"{forward:.3f}", f"{host:.3f}", f"{host / total:.0%}",
                f"{host / batch * 1e3:.1f}",
                count(statistics.fmean(i.ops for i in iterations)),
                count(statistics.fmean(i.steps for i in iterations)),
                str(sum(run.stalls for run in runs)), str(sum(run.preemptions for run in runs))])
    return header, rows


def sanity_rows(r: Results) -> list[report.Row]:
    """Every timed iteration ran the whole batch, nothing preempted, one Step at most each."""
    runs = [(batch, run) for (batch, _), runs in r.runs.items() for run in runs]
    full = sum(run.decoding == batch for batch, run in runs)
    preempted = sum(run.preemptions for _, run in runs)
    expected = r.settings.iterations
    timed = sum(len(run.iterations) == expected for _, run in runs)
    return [
        report.Row("runs whose every sequence decoded through the timed iterations",
                   f"{full} of {len(runs)}", f"all {len(runs)}", full == len(runs)),
        report.Row(f"runs that timed {expected} iterations", f"{timed} of {len(runs)}",
                   f"all {len(runs)}", timed == len(runs)),
        report.Row("preemptions in timed iterations", str(preempted), "0", preempted == 0),
    ]


def failed(r: Results) -> bool:
    return any(row.met is False for row in sanity_rows(r))


def settings_lines(r: Results) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    s = r.settings
    rounds = {1: "once", 2: "twice"}.get(s.rounds, f"{s.rounds} times")
    base = ", ".join(f"{key}={value!r}" for key, value in BASE_OPTIONS.items())
    contenders = "; ".join(f"**{label}**: " + (", ".join(f"{k}={v!r}" for k, v in o.items())
                                               or "the defaults")
                           for label, o in r.contenders.items())
    return [
        f"Model `{r.model}`, float32, on the CPU, torch on {r.threads} "
        f"thread{plural(r.threads)}; "
        f"in-process engine (`build_engine` with a `LocalBlockAllocator`), EngineOptions "
        f"defaults but {base}.",
        f"Contenders (EngineOptions overrides): {contenders}.",
        f"Decode batches of {', '.join(map(str, s.batch_sizes))} sequences; prompts uniform in "
        f"[{s.prompt_low}, {s.prompt_high}] tokens, greedy, end-of-sequence ignored.",
        f"Per run: {s.warm_iterations} untimed decode iteration{plural(s.warm_iterations)}, "
        f"then {s.iterations} timed; "
        f"every contender runs every batch size {rounds}, the order rotating; the medians and "
        f"means are over all {s.iterations * s.rounds} timed iterations.",
    ]


def section_body(r: Results, png: Path | None, md: Path) -> str:
    lines = [
        *report.section_preamble("Iteration"),
        *(report.list_item(line) for line in settings_lines(r)), "",
        report.markdown_grid(*summary_grid(r)),
    ]
    for batch in r.settings.batch_sizes:
        lines += ["", f"Batch {batch}:", "",
                  report.markdown_grid(*batch_grid(r, batch, markdown=True))]
    lines += ["", report.markdown_table(sanity_rows(r))]
    if png is not None:
        lines += ["", report.image_link(png, md, "iteration benchmark")]
    return "\n".join(lines)


def write_json(r: Results, directory: Path) -> Path:
    s = r.settings
    data = {
        "preset": s.name, "model": r.model, "threads": r.threads,
        "batch_sizes": list(s.batch_sizes), "iterations": s.iterations,
        "warm_iterations": s.warm_iterations, "rounds": s.rounds,
        "base_options": BASE_OPTIONS, "contenders": r.contenders, "phases": list(PHASES),
        "runs": [{"batch": batch, "contender": label,
                  "rounds": [{"stalls": run.stalls, "preemptions": run.preemptions,
                              "decoding": run.decoding,
                              "iterations": [{"total_ns": i.total_ns, "ops": i.ops,
                                              "steps": i.steps, "gc_ns": i.gc_ns,
                                              "collections": i.collections, **i.phase_ns}
                                             for i in run.iterations]}
                             for run in runs]}
                 for (batch, label), runs in r.runs.items()],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "iteration_bench.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
