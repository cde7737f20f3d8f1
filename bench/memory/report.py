"""What the memory benchmark reports: the rows with their targets, the per-scheme grid (terminal
and markdown), the raw JSON and its `## Memory` section of docs/benchmarks.md. The plot is
plot.py; how the benchmark measures is written once, by hand, in docs/benchmarks.md (`## Memory:
how it is measured`)."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench import report
from bench.memory.samples import CONTIGUOUS, SchemeRun, paged_name
from bench.memory.workload import Settings, Workload

# Llama-3-8B's shape in bfloat16: 32 layers × K and V × 8 heads × 128 dims × 2 bytes per token.
EXAMPLE_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2


@dataclass(slots=True)
class Results:
    settings: Settings
    workload: Workload
    # The contiguous scheme, the power-of-two one, then pagedserve by block size.
    runs: list[SchemeRun]

    def run(self, name: str) -> SchemeRun:
        return next(run for run in self.runs if run.name == name)

    @property
    def headline(self) -> SchemeRun:
        return self.run(paged_name(self.settings.headline_block_size))

    def vs_contiguous(self, run: SchemeRun) -> float:
        """Mean concurrent sequences while requests wait, over the contiguous scheme's."""
        return run.mean_sequences() / self.run(CONTIGUOUS).mean_sequences()

    @property
    def paged_runs(self) -> list[SchemeRun]:
        return [run for run in self.runs if run.name.startswith("paged")]


def later_half_mean(run: SchemeRun) -> float:
    """Mean concurrent sequences over the later half of the saturated period: past the fill-up
    at t = 0, when the paged cache briefly holds many young (short) requests."""
    samples = run.period()
    return statistics.fmean(sample.sequences for sample in samples[len(samples) // 2:])


def target_rows(r: Results) -> list[report.Row]:
    s, paged, contiguous = r.settings, r.headline, r.run(CONTIGUOUS)
    bs = s.headline_block_size
    return [
        report.Row(f"allocated KV slots holding tokens while requests wait, paged block {bs}",
                   f"{paged.slot_share():.1%}", f"≥ {s.target_paged_share:.0%}",
                   paged.slot_share() >= s.target_paged_share),
        report.Row(f"mean concurrent sequences while requests wait, paged block {bs} / "
                   "contiguous max-length reservation",
                   f"{r.vs_contiguous(paged):.2f}× ({paged.mean_sequences():.1f} / "
                   f"{contiguous.mean_sequences():.1f})", f"≥ {s.target_concurrency_ratio:g}×",
                   r.vs_contiguous(paged) >= s.target_concurrency_ratio),
    ]


def result_rows(r: Results) -> list[report.Row]:
    Row = report.Row
    s, paged, contiguous, pow2 = r.settings, r.headline, r.run(CONTIGUOUS), r.run("pow2")
    bs, n = s.headline_block_size, s.num_requests
    rows = target_rows(r)
    rows += [
        Row("the same ratio over the later half of that period (past the fill-up at t = 0)",
            f"{later_half_mean(paged) / later_half_mean(contiguous):.2f}× "
            f"({later_half_mean(paged):.1f} / {later_half_mean(contiguous):.1f})"),
        Row("allocated KV slots holding tokens while requests wait: contiguous max-length / "
            "power-of-two", f"{contiguous.slot_share():.1%} / {pow2.slot_share():.1%}"),
        Row("allocated KV slots holding tokens while requests wait, paged: block "
            + " / ".join(run.name.split("-")[1] for run in r.paged_runs),
            " / ".join(f"{run.slot_share():.1%}" for run in r.paged_runs)),
        Row(f"iterations to serve all {n} requests: contiguous / power-of-two / paged block {bs}",
            f"{contiguous.num_iterations:,} / {pow2.num_iterations:,} / "
            f"{paged.num_iterations:,}"),
        Row(f"paged block {bs}: preemptions (freed, recomputed on readmission)",
            f"{paged.preemptions:,}"),
    ]
    complete = [run.completed for run in r.runs]
    rows.append(Row("requests that completed with all their tokens (sanity check)",
                    f"{min(complete)} of {n} in each of the {len(r.runs)} runs"
                    if min(complete) == max(complete) else
                    " / ".join(f"{count}" for count in complete) + f" of {n}",
                    f"all {n}", all(count == n for count in complete)))
    checked = sum(run.checked for run in r.paged_runs)
    agreed = sum(run.agreed for run in r.paged_runs)
    rows.append(Row("paged samples equal to the admin API's `pool_stats` (sanity check)",
                    f"{agreed} of {checked}", "all", checked > 0 and agreed == checked))
    return rows


def sane(r: Results) -> bool:
    return all(row.met for row in result_rows(r)[-2:])


def scheme_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["scheme", "allocated slots holding tokens", "KV budget holding tokens",
              "concurrent sequences: mean", "max", "mean vs contiguous",
              "iterations: requests waiting / all", "preemptions",
              "whole run: slots holding tokens", "whole run: mean sequences"]
    rows = [[run.label, f"{run.slot_share():.1%}", f"{run.budget_share():.1%}",
             f"{run.mean_sequences():.1f}", f"{run.max_sequences()}",
             f"{r.vs_contiguous(run):.2f}×",
             f"{run.num_saturated:,} / {run.num_iterations:,}", f"{run.preemptions:,}",
             f"{run.slot_share(whole_run=True):.1%}",
             f"{run.mean_sequences(whole_run=True):.1f}"] for run in r.runs]
    return header, rows


def target_lines(r: Results) -> list[str]:
    return [f"{row.metric}: {row.measured} (target {row.target}): "
            f"{'met' if row.met else 'NOT met'}" for row in target_rows(r)]


def settings_lines(r: Results) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    s, w = r.settings, r.workload
    example = s.budget_slots * EXAMPLE_BYTES_PER_TOKEN / 1024 ** 3
    return [
        f"{s.num_requests} requests, all waiting at t = 0, one completion each.",
        f"Prompt lengths {s.prompt_lens.describe()} (drawn: "
        f"{report.drawn_lengths(w.prompt_lens)}; {sum(w.prompt_lens):,} tokens); output lengths "
        f"{s.output_lens.describe()} (drawn: {report.drawn_lengths(w.output_lens)}; "
        f"{sum(w.output_lens):,} tokens).",
        f"KV budget of every scheme: {s.budget_slots:,} token slots ({example:g} GiB at "
        "Llama-3-8B's shape in bfloat16, 128 KiB per token); contiguous max-length reservation: "
        f"{s.max_model_len:,} slots per request; {s.max_batched_tokens} tokens per iteration; "
        f"pagedserve: {s.lookahead_slots} lookahead slots.",
    ]


def section_body(r: Results, png: Path | None, md: Path) -> str:
    lines = [
        *report.section_preamble("Memory"),
        *(report.list_item(line) for line in settings_lines(r)), "",
        *(f"- **{line}**" for line in target_lines(r)), "",
        report.markdown_table(result_rows(r)), "",
        report.markdown_grid(*scheme_grid(r)),
    ]
    if png is not None:
        lines += ["", report.image_link(png, md, "memory benchmark")]
    return "\n".join(lines)


def write_json(r: Results, directory: Path) -> Path:
    """The raw numbers, for scripts that gather several benchmarks."""
    s, w = r.settings, r.workload
    data = {
        "preset": s.name, "num_requests": s.num_requests, "budget_slots": s.budget_slots,
        "max_model_len": s.max_model_len, "max_batched_tokens": s.max_batched_tokens,
        "lookahead_slots": s.lookahead_slots,
        "prompt_lens": w.prompt_lens, "output_lens": w.output_lens,
        "schemes": [{
            "name": run.name, "label": run.label, "wall_s": run.wall_s,
            "iterations": run.num_iterations, "saturated_iterations": run.num_saturated,
            "slot_share": run.slot_share(), "budget_share": run.budget_share(),
            "mean_sequences": run.mean_sequences(), "max_sequences": run.max_sequences(),
            "vs_contiguous": r.vs_contiguous(run),
            "whole_run": {"slot_share": run.slot_share(whole_run=True),
                          "budget_share": run.budget_share(whole_run=True),
                          "mean_sequences": run.mean_sequences(whole_run=True),
                          "max_sequences": run.max_sequences(whole_run=True)},
            "preemptions": run.preemptions, "completed": run.completed,
        } for run in r.runs],
        "rows": [{"metric": row.metric, "measured": row.measured, "target": row.target,
                  "met": row.met} for row in result_rows(r)],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "memory_bench.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
