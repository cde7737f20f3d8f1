"""What the sharing benchmark records and reports: both modes' runs of every case, the rows
(with the vLLM paper's figures beside ours, for reference), the grid, the raw JSON and the
`## Sharing` section of docs/benchmarks.md. The plot is plot.py; how the benchmark measures and
why its savings land where they do is written once, by hand, in docs/benchmarks.md."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from allocator_service.core.executor_pool import blocks_for
from bench import report
from bench.sharing.run import Run
from bench.sharing.workload import BLOCK_SIZE, PARALLEL, SYSTEM, Case, Settings

# The vLLM paper (Kwon et al., SOSP 2023), §6.3 / Fig. 15: blocks saved by sharing over blocks
# without sharing, OPT-13B, parallel sampling n = 2, 4, 6 (6.1-9.8% on Alpaca, 16.2-30.5% on
# ShareGPT).
PAPER_PARALLEL_RANGE = (0.061, 0.305)
# Outputs this many times ours, for the "what longer outputs would give" figure.
LONGER_OUTPUTS = 5


@dataclass(slots=True)
class Pair:
    """One case run both ways; the fastest run of each mode counts."""
    case: Case
    unshared: list[Run] = field(default_factory=list)
    shared: list[Run] = field(default_factory=list)

    @property
    def best_unshared(self) -> Run:
        return max(self.unshared, key=lambda run: run.tokens_per_s)

    @property
    def best_shared(self) -> Run:
        return max(self.shared, key=lambda run: run.tokens_per_s)

    @property
    def mean_saving(self) -> float:
        return 1 - self.best_shared.mean_blocks / self.best_unshared.mean_blocks

    @property
    def iteration_mean_saving(self) -> float:
        return 1 - self.best_shared.iteration_mean_blocks / \
            self.best_unshared.iteration_mean_blocks

    @property
    def peak_saving(self) -> float:
        return 1 - self.best_shared.peak_blocks / self.best_unshared.peak_blocks

    @property
    def speedup(self) -> float:
        """Shared over not shared, in output tokens per second."""
        return self.best_shared.tokens_per_s / self.best_unshared.tokens_per_s

    def complete_runs(self) -> tuple[int, int]:
        """(runs in which every choice returned all the tokens it asked for, runs)."""
        def complete(run: Run, shared: bool) -> bool:
            wanted = [s.params.max_tokens for s in self.case.submissions(shared, "")]
            return len(run.tokens) == len(wanted) and all(
                len(choice) == want for choices, want in zip(run.tokens, wanted)
                for choice in choices)

        done = sum(complete(run, True) for run in self.shared) + \
            sum(complete(run, False) for run in self.unshared)
        return done, len(self.shared) + len(self.unshared)

    def equal_outputs(self) -> tuple[int, int]:
        """(choices whose tokens equal their twin's in the other mode, choices), last runs."""
        shared = [choice for choices in self.shared[-1].tokens for choice in choices]
        unshared = [choice for choices in self.unshared[-1].tokens for choice in choices]
        return sum(a == b for a, b in zip(shared, unshared)), len(shared)


@dataclass(slots=True)
class Results:
    settings: Settings
    model: str
    num_blocks: int
    # torch's CPU threads (bench.sharing says why one by default).
    threads: int
    pairs: list[Pair]

    def of_kind(self, kind: str) -> list[Pair]:
        return [pair for pair in self.pairs if pair.case.kind == kind]


def saving_rows(r: Results) -> list[report.Row]:
    Row = report.Row
    rows = []
    for pair in r.of_kind(PARALLEL):
        rows.append(Row(f"{pair.case.label}: KV blocks saved by fork (mean over the run)",
                        f"{pair.mean_saving:.1%} (peak {pair.peak_saving:.1%})",
                        "vLLM paper: 6–30% (reference)"))
    rows.append(Row("beam search: KV blocks saved",
                    "see ## Beam search (bench/beam)",
                    "vLLM paper: 37–66% (reference)"))
    for pair in r.of_kind(SYSTEM):
        rows.append(Row(f"{pair.case.label}: KV blocks saved by the prefix cache "
                        "(mean over the run)",
                        f"{pair.mean_saving:.1%} (peak {pair.peak_saving:.1%})"))
        rows.append(Row(f"{pair.case.label}: output tokens/s, shared / not shared",
                        f"{pair.speedup:.2f}×"))
    return rows


def sanity_rows(r: Results) -> list[report.Row]:
    Row = report.Row
    complete = [pair.complete_runs() for pair in r.pairs]
    done, runs = sum(c for c, _ in complete), sum(n for _, n in complete)
    preemptions = sum(run.preemptions for pair in r.pairs for run in pair.unshared + pair.shared)
    rows = [
        Row("runs in which every request returned all its tokens (sanity check)",
            f"{done} of {runs}", f"all {runs}", done == runs),
        Row("preemptions in any run (sanity check: the cache held every run)",
            f"{preemptions}", "0", preemptions == 0),
    ]
    for pair in r.of_kind(SYSTEM):
        same, total = pair.equal_outputs()
        rows.append(Row("greedy outputs equal with and without the prefix cache (sanity check)",
                        f"{same} of {total}", f"all {total}", same == total))
    parallel = [pair.equal_outputs() for pair in r.of_kind(PARALLEL)]
    rows.append(Row("sampled choices equal to their unshared twin (same seeds)",
                    f"{sum(s for s, _ in parallel)} of {sum(t for _, t in parallel)}"))
    return rows


def result_rows(r: Results) -> list[report.Row]:
    return saving_rows(r) + sanity_rows(r)


def failed(r: Results) -> bool:
    return any(row.met is False for row in result_rows(r))


def case_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["workload", "KV blocks, mean: not shared → shared", "saved",
              "peak: not shared → shared", "saved", "expected at peak",
              "prompt tokens computed", "output tokens/s: not shared", "shared",
              "shared / not shared"]
    rows = []
    for pair in r.pairs:
        unshared, shared = pair.best_unshared, pair.best_shared
        rows.append([
            pair.case.label,
            f"{unshared.mean_blocks:,.0f} → {shared.mean_blocks:,.0f}", f"{pair.mean_saving:.1%}",
            f"{unshared.peak_blocks:,} → {shared.peak_blocks:,}", f"{pair.peak_saving:.1%}",
            f"{pair.case.expected_peak_saving():.1%}",
            f"{unshared.prompt_tokens_computed:,} → {shared.prompt_tokens_computed:,}",
            f"{unshared.tokens_per_s:,.0f}", f"{shared.tokens_per_s:,.0f}",
            f"{pair.speedup:.2f}×"])
    return header, rows


def settings_lines(r: Results) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    s = r.settings
    runs = {1: "once", 2: "twice"}.get(s.rounds, f"{s.rounds} times")
    threads = "one torch thread" if r.threads == 1 else f"{r.threads} torch threads"
    lines = [f"Engine: model `{r.model}`, float32 on the CPU, {threads}, block size {BLOCK_SIZE}, "
             f"at most {s.max_batched_tokens} tokens per iteration, a KV cache of "
             f"{r.num_blocks:,} blocks ({r.num_blocks * BLOCK_SIZE:,} tokens); each mode runs "
             f"{runs}, the fastest counts."]
    parallel = r.of_kind(PARALLEL)
    if parallel:
        lengths = [len(prompt) for prompt in parallel[0].case.prompts]
        lines.append(f"Parallel sampling, n = {', '.join(str(p.case.n) for p in parallel)}: "
                     f"{len(lengths)} prompts, lengths {s.prompt_lens.describe()} (drawn: "
                     f"{report.drawn_lengths(lengths)}), {s.output_len} output tokens per "
                     "choice.")
    for pair in r.of_kind(SYSTEM):
        case = pair.case
        lines.append(f"Shared system prompt: {len(case.users)} requests, a {len(case.system)}-"
                     f"token system prompt ({len(case.system) // BLOCK_SIZE} full blocks) and "
                     f"a user part ({s.user_lens.describe()}), {s.output_len} greedy output "
                     "tokens.")
    return lines


def figure_lines(r: Results) -> list[str]:
    """The figures behind the grid that the method section's reading refers to."""
    lines = []
    parallel = r.of_kind(PARALLEL)
    if parallel:
        output_len = r.settings.output_len
        prompts = parallel[0].case.prompts
        share = sum(len(p) // BLOCK_SIZE for p in prompts) / \
            sum(blocks_for(len(p) + output_len, BLOCK_SIZE) for p in prompts)
        longer = [pair.case.expected_peak_saving(LONGER_OUTPUTS * output_len)
                  for pair in parallel]
        low, high = PAPER_PARALLEL_RANGE
        where = "inside" if all(low <= value <= high for value in longer) else "not all inside"
        lines.append(
            f"Parallel sampling: full prompt blocks are {share:.0%} of a sequence's blocks at "
            f"full length. With outputs {LONGER_OUTPUTS} times as long "
            f"({LONGER_OUTPUTS * output_len} tokens) the same count predicts "
            f"{', '.join(f'{value:.0%}' for value in longer)} for n = "
            f"{', '.join(str(pair.case.n) for pair in parallel)}, {where} the paper's range.")
    for pair in r.of_kind(SYSTEM):
        case, shared = pair.case, pair.best_shared
        served = round(shared.cached_tokens / len(case.system)) if case.system else 0
        lines.append(
            f"Shared system prompt: {served} of {len(case.users)} requests found its "
            f"{len(case.system) // BLOCK_SIZE} blocks in the prefix cache "
            f"({shared.cached_tokens:,} prompt tokens served from it); admitted before any "
            f"copy of it was computed: {len(case.users) - served}.")
    return lines


def section_body(r: Results, png: Path | None, md: Path) -> str:
    lines = [
        *report.section_preamble("Sharing"),
        *(report.list_item(line) for line in settings_lines(r)), "",
        report.markdown_grid(*case_grid(r)), "",
        report.markdown_table(result_rows(r)), "",
        *(report.list_item(line) for line in figure_lines(r)), "",
    ]
    if png is not None:
        lines += [report.image_link(png, md, "sharing benchmark")]
    return "\n".join(lines)


def write_json(r: Results, directory: Path) -> Path:
    def run_data(run: Run) -> dict:
        return {"wall_s": run.wall_s, "output_tokens": run.num_tokens,
                "tokens_per_s": run.tokens_per_s, "mean_blocks": run.mean_blocks,
                "iteration_mean_blocks": run.iteration_mean_blocks,
                "peak_blocks": run.peak_blocks, "iterations": len(run.blocks),
                "prompt_tokens_computed": run.prompt_tokens_computed,
                "cached_tokens": run.cached_tokens, "preemptions": run.preemptions,
                "blocks_per_iteration": [used for used, _ in run.blocks]}

    data = {
        "preset": r.settings.name, "model": r.model, "num_blocks": r.num_blocks,
        "threads": r.threads,
        "cases": [{"workload": pair.case.label, "kind": pair.case.kind, "n": pair.case.n,
                   "prompt_lens": [len(prompt) for prompt in pair.case.prompts],
                   "output_len": r.settings.output_len,
                   "mean_saving": pair.mean_saving,
                   "iteration_mean_saving": pair.iteration_mean_saving,
                   "peak_saving": pair.peak_saving,
                   "expected_peak_saving": pair.case.expected_peak_saving(),
                   "shared_over_unshared_tokens_per_s": pair.speedup,
                   "unshared": [run_data(run) for run in pair.unshared],
                   "shared": [run_data(run) for run in pair.shared]} for pair in r.pairs],
        "rows": [{"metric": row.metric, "measured": row.measured, "target": row.target,
                  "met": row.met} for row in result_rows(r)],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sharing_bench.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
