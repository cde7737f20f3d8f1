"""What the throughput benchmark records and reports: every round of every contender, the rows
with their targets, the tables (terminal and markdown), the raw JSON and its `## Throughput`
section of docs/benchmarks.md. The plot is plot.py; how the benchmark measures is written once, by
hand, in docs/benchmarks.md (`## Throughput: how it is measured`)."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.throughput.contenders import CONTINUOUS, OURS, STATIC, Round
from bench.throughput.workload import Settings, Workload

LABELS = {OURS: "pagedserve engine (in-process)",
          STATIC: "transformers static `generate`",
          CONTINUOUS: "transformers `generate_batch`"}
# Mismatched requests printed, at most.
SHOWN_MISMATCHES = 5


@dataclass(slots=True)
class Results:
    settings: Settings
    workload: Workload
    model: str
    device: str
    # Tokens our KV cache holds; transformers' continuous batching got the same.
    cache_tokens: int = 0
    rounds: dict[str, list[Round]] = field(default_factory=lambda: {OURS: [], STATIC: [],
                                                                    CONTINUOUS: []})

    def best(self, contender: str) -> Round:
        return max(self.rounds[contender], key=lambda run: run.tokens_per_s)

    def ratio(self, contender: str) -> float:
        """Ours over `contender`, in output tokens per second."""
        return self.best(OURS).tokens_per_s / self.best(contender).tokens_per_s

    def matches(self, contender: str) -> list[bool]:
        """Per request: did `contender` generate exactly our greedy tokens?"""
        ours = self.rounds[OURS][-1].tokens
        return [mine == theirs for mine, theirs in zip(ours, self.rounds[contender][-1].tokens)]

    @property
    def exact_dtype(self) -> bool:
        # Only in float32 are greedy tokens expected to agree one for one across
        # implementations; half precision's rounding flips near-ties.
        return self.settings.dtype == "float32"


def target_rows(r: Results) -> list[report.Row]:
    s = r.settings
    return [
        report.Row(f"ours / {LABELS[STATIC]} (batch {s.hf_batch}), output tokens/s",
                   f"{r.ratio(STATIC):.2f}×", f"≥ {s.target_vs_static:g}×",
                   r.ratio(STATIC) >= s.target_vs_static),
        report.Row(f"ours / {LABELS[CONTINUOUS]}, output tokens/s",
                   f"{r.ratio(CONTINUOUS):.2f}×", f"≥ {s.target_vs_continuous:g}×",
                   r.ratio(CONTINUOUS) >= s.target_vs_continuous),
    ]


def result_rows(r: Results) -> list[report.Row]:
    Row = report.Row
    ours = r.best(OURS)
    rows = [Row(f"{LABELS[name]}: output tokens/s (best of {len(r.rounds[name])})",
                f"{r.best(name).tokens_per_s:,.0f}") for name in (OURS, STATIC, CONTINUOUS)]
    rows += target_rows(r)
    stall_share = ours.stalls / ours.decodes if ours.decodes else 0.0
    rows += [
        Row("ours: allocator stalls (decodes that waited for their slot) / decodes",
            f"{ours.stalls:,} / {ours.decodes:,} ({stall_share:.1%})"),
        Row("ours: engine iterations (Steps), preemptions", f"{ours.steps:,}, {ours.preemptions}"),
    ]
    decode_only = [(decoding, step_s) for decoding, prompt, step_s in ours.batches if not prompt]
    if decode_only:
        decode_s = sum(step_s for _, step_s in decode_only)
        busiest = max(decoding for decoding, _ in decode_only)
        at_busiest = [step_s for decoding, step_s in decode_only if decoding == busiest]
        rows.append(Row("ours: iterations without prompt tokens: time, share of the run; "
                        "median one at the largest batch",
                        f"{decode_s:.2f} s, {decode_s / ours.wall_s:.0%}; "
                        f"{statistics.median(at_busiest) * 1e3:.0f} ms for {busiest} sequences"))
    expected = r.workload.num_output_tokens
    for name in (STATIC, CONTINUOUS):
        same = sum(r.matches(name))
        total = len(r.workload.prompts)
        rows.append(Row(f"requests whose greedy tokens equal ours: {LABELS[name]}",
                        f"{same} of {total}", f"all {total}" if r.exact_dtype else "",
                        same == total if r.exact_dtype else None))
    counts = [run.num_tokens for runs in r.rounds.values() for run in runs]
    rows.append(Row("output tokens every run returned (sanity check)",
                    " / ".join(sorted({f"{count:,}" for count in counts})), f"{expected:,}",
                    all(count == expected for count in counts)))
    return rows


def contender_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["contender", "output tokens/s (best)", "every round (tokens/s)",
              "wall time (best)", "ours is"]
    rows = []
    for name in (OURS, STATIC, CONTINUOUS):
        best = r.best(name)
        rows.append([LABELS[name], f"{best.tokens_per_s:,.0f}",
                     " / ".join(f"{run.tokens_per_s:,.0f}" for run in r.rounds[name]),
                     f"{best.wall_s:.1f} s", "—" if name == OURS else f"{r.ratio(name):.2f}×"])
    return header, rows


def mismatch_lines(r: Results) -> list[str]:
    """Where each contender first left our greedy path, for the first few requests that did."""
    lines = []
    ours = r.rounds[OURS][-1].tokens
    for name in (STATIC, CONTINUOUS):
        theirs = r.rounds[name][-1].tokens
        wrong = [i for i, same in enumerate(r.matches(name)) if not same]
        for index in wrong[:SHOWN_MISMATCHES]:
            position = next((p for p, (a, b) in enumerate(zip(ours[index], theirs[index]))
                             if a != b), min(len(ours[index]), len(theirs[index])))
            lines.append(f"MISMATCH {LABELS[name]}: request {index} (prompt "
                         f"{len(r.workload.prompts[index])} tokens) first differs at output "
                         f"token {position}: ours {ours[index][position:position + 4]}, "
                         f"theirs {theirs[index][position:position + 4]}")
        if len(wrong) > SHOWN_MISMATCHES:
            lines.append(f"... and {len(wrong) - SHOWN_MISMATCHES} more for {LABELS[name]}")
    return lines


def target_lines(r: Results) -> list[str]:
    return [f"{row.metric}: {row.measured} (target {row.target}): "
            f"{'met' if row.met else 'NOT met'}" for row in target_rows(r)]


def settings_lines(r: Results) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    s, w = r.settings, r.workload
    lengths = sorted(len(prompt) for prompt in w.prompts)
    rounds = {1: "once", 2: "twice"}.get(s.rounds, f"{s.rounds} times")
    return [
        f"Model `{r.model}`, {s.dtype}, on {r.device}.",
        f"{len(w.prompts)} requests, all submitted at once. Prompt lengths "
        f"{s.prompt_lens.describe()} (drawn: {report.drawn_lengths(lengths)}; "
        f"{w.num_prompt_tokens:,} prompt tokens); output {s.output_lens.describe()} tokens per "
        f"request ({w.num_output_tokens:,} in all).",
        f"Ours and transformers `generate_batch`: a KV cache of {r.cache_tokens:,} tokens, "
        f"{s.max_batched_tokens} tokens per iteration at most; transformers static `generate`: "
        f"batches of {s.hf_batch}.",
        f"Every contender runs {rounds}, the fastest run counting.",
    ]


def section_body(r: Results, png: Path | None, md: Path) -> str:
    machine = (f"Measured {report.today()} on {report.machine_description()}"
               + ("" if r.device == "cpu" else f", {r.device}") + ".")
    lines = [
        *report.section_preamble("Throughput", machine),
        *(report.list_item(line) for line in settings_lines(r)), "",
        *(f"- **{line}**" for line in target_lines(r)), "",
        report.markdown_table(result_rows(r)), "",
        report.markdown_grid(*contender_grid(r)),
    ]
    mismatches = mismatch_lines(r)
    if mismatches:
        lines += ["", *(f"- {line}" for line in mismatches)]
    if png is not None:
        lines += ["", report.image_link(png, md, "throughput benchmark")]
    return "\n".join(lines)


def write_json(r: Results, directory: Path) -> Path:
    """The raw numbers, for scripts that gather several benchmarks (bench/gpu_all.sh)."""
    s = r.settings
    data = {
        "preset": s.name, "model": r.model, "device": r.device, "dtype": s.dtype,
        "num_requests": len(r.workload.prompts), "hf_batch": s.hf_batch,
        "cache_tokens": r.cache_tokens, "max_batched_tokens": s.max_batched_tokens,
        "prompt_lens": [len(prompt) for prompt in r.workload.prompts],
        "output_lens": r.workload.output_lens,
        "rounds": {name: [{"wall_s": run.wall_s, "output_tokens": run.num_tokens,
                           "tokens_per_s": run.tokens_per_s}
                          | ({"steps": run.steps, "stalls": run.stalls,
                              "decodes": run.decodes, "preemptions": run.preemptions}
                             if name == OURS else {})
                          for run in runs] for name, runs in r.rounds.items()},
        "ours_over": {STATIC: r.ratio(STATIC), CONTINUOUS: r.ratio(CONTINUOUS)},
        "matching_requests": {name: sum(r.matches(name)) for name in (STATIC, CONTINUOUS)},
        "rows": [{"metric": row.metric, "measured": row.measured, "target": row.target,
                  "met": row.met} for row in result_rows(r)],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "throughput_bench.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
