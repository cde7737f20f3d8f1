"""What the beam-search benchmark records and reports: the blocks held per width (shared and
unshared), every contender's timed runs, the grids, the raw JSON and the `## Beam search`
section of docs/benchmarks.md. The plot is plot.py."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import report
from bench.beam.contenders import CONTENDERS, HF_BATCHED, HF_SEQUENTIAL, LABELS, PAGEDSERVE, VLLM

JSON_NAME = "beam_bench.json"
QUICK_NOTE = ("A validation run (--quick: short prompts and outputs, one round), which proves "
              "the path end to end; not the measurement (`make bench-beam`).")
# The vLLM paper (Kwon et al., SOSP 2023), §6.3 / Fig. 15: beam search saves 37.6-55.2% of the
# blocks on Alpaca and 44.3-66.3% on ShareGPT (OPT-13B, widths 2, 4, 6).
PAPER_RANGE = (0.376, 0.663)
TARGET_SAVED_AT_4 = 0.50
TARGET_OVER_TRANSFORMERS = 5.0
TARGET_OVER_VLLM = 2.0


@dataclass(slots=True)
class Settings:
    widths: tuple[int, ...]
    num_requests: int
    prompt_len: int
    output_len: int
    rounds: int
    # The in-process engine the blocks are counted in.
    memory_prompts: int
    memory_block_size: int
    # What both servers are given alike (bench/peers/stacks.py ServerSettings, no model).
    server: dict


@dataclass(slots=True)
class Blocks:
    """One width's counts over every iteration of its requests."""
    width: int
    mean_shared: float
    mean_unshared: float
    peak_shared: int
    peak_unshared: int

    @classmethod
    def from_samples(cls, width: int, samples: list[tuple[int, int]]) -> Blocks:
        """From memory.count_blocks' (shared, unshared) samples, every iteration alike."""
        shared, unshared = [s for s, _ in samples], [u for _, u in samples]
        return cls(width, sum(shared) / len(samples), sum(unshared) / len(samples),
                   max(shared), max(unshared))

    @property
    def saved(self) -> float:
        """The share of the unshared blocks that sharing saves, over the whole run."""
        return 1.0 - self.mean_shared / self.mean_unshared

    @property
    def peak_saved(self) -> float:
        return 1.0 - self.peak_shared / self.peak_unshared


@dataclass(slots=True)
class Run:
    workload: str
    width: int
    contender: str
    round_index: int
    position: int          # which of the round's runs it was (0: first): the alternation
    wall_s: float
    output_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s


@dataclass(slots=True)
class Results:
    settings: Settings
    vllm_version: str
    # workload name -> what model it serves, in words
    workloads: dict[str, str]
    blocks: list[Blocks] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    quick: bool = False

    def tokens_per_s(self, workload: str, width: int, contender: str) -> float:
        """The median over the rounds."""
        return statistics.median(run.tokens_per_s for run in self.runs
                                 if (run.workload, run.width, run.contender)
                                 == (workload, width, contender))

    def ratio(self, workload: str, width: int, other: str) -> float:
        return (self.tokens_per_s(workload, width, PAGEDSERVE)
                / self.tokens_per_s(workload, width, other))

    def blocks_at(self, width: int) -> Blocks | None:
        return next((b for b in self.blocks if b.width == width), None)


def blocks_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["beam width", "blocks held, shared (mean)", "unshared (mean)", "saved",
              "peak shared", "peak unshared", "peak saved"]
    rows = [[str(b.width), f"{b.mean_shared:,.1f}", f"{b.mean_unshared:,.1f}",
             f"{b.saved:.1%}", str(b.peak_shared), str(b.peak_unshared),
             f"{b.peak_saved:.1%}"] for b in r.blocks]
    return header, rows


def throughput_grid(r: Results, workload: str) -> tuple[list[str], list[list[str]]]:
    header = ["beam width", *(f"{LABELS[c]} tok/s" for c in CONTENDERS),
              *(f"pagedserve / {LABELS[c]}" for c in CONTENDERS[1:])]
    rows = []
    for width in r.settings.widths:
        rows.append([str(width),
                     *(f"{r.tokens_per_s(workload, width, c):,.0f}" for c in CONTENDERS),
                     *(f"{r.ratio(workload, width, c):.2f}×" for c in CONTENDERS[1:])])
    return header, rows


def target_rows(r: Results) -> list[report.Row]:
    rows = []
    at_4 = r.blocks_at(4)
    if at_4 is not None:
        rows.append(report.Row("KV blocks saved by sharing at width 4 (mean over the run)",
                               f"{at_4.saved:.1%}", f"≥ {TARGET_SAVED_AT_4:.0%}",
                               at_4.saved >= TARGET_SAVED_AT_4))
    for workload in r.workloads:
        for other, target in ((VLLM, TARGET_OVER_VLLM), (HF_BATCHED, TARGET_OVER_TRANSFORMERS),
                              (HF_SEQUENTIAL, TARGET_OVER_TRANSFORMERS)):
            ratios = [r.ratio(workload, width, other) for width in r.settings.widths]
            rows.append(report.Row(
                f"`{workload}`: pagedserve / {LABELS[other]}, output tok/s (widths "
                f"{', '.join(map(str, r.settings.widths))})",
                ", ".join(f"{ratio:.2f}×" for ratio in ratios), f"≥ {target:g}×",
                min(ratios) >= target))
    return rows


def settings_lines(r: Results) -> list[str]:
    s, server = r.settings, r.settings.server
    rounds = {1: "once", 2: "twice"}.get(s.rounds, f"{s.rounds} times")
    return [
        f"Requests: {s.num_requests} prompts of {s.prompt_len} random token ids, sent at once, "
        f"beam width k = {', '.join(map(str, s.widths))}, all k hypotheses returned, "
        f"{s.output_len} output tokens each (end-of-sequence ignored, length_penalty 1, "
        "early_stopping false). Output tokens/s counts every returned hypothesis's tokens, "
        "the same count for every contender.",
        f"Servers (pagedserve `up`, `vllm serve` {r.vllm_version}): {server['dtype']}, block "
        f"size {server['block_size']}, a {server['kv_cache_gib']} GiB KV cache, at most "
        f"{server['max_num_seqs']} sequences and {server['max_num_batched_tokens']} tokens per "
        "step, through their OpenAI HTTP API (`use_beam_search`, `n` the width). transformers "
        "runs in the benchmark's process, float32, its `generate(num_beams=k, "
        "num_return_sequences=k)`: batched (all requests in one call) and one by one.",
        f"Each contender ran each width {rounds}, the order rotating from round to round; "
        "every figure is the median over the rounds.",
        f"Blocks: {s.memory_prompts} requests per width, one at a time, in an in-process "
        f"engine (block size {s.memory_block_size}, the embedded model, nothing preempted), "
        "counted after every iteration (bench/beam/memory.py): shared is the distinct blocks "
        "the allocator holds for the request's beams, unshared the sum of the beams' table "
        "lengths, what the same beams would hold with a copy of their history each. The vLLM "
        f"paper reports {PAPER_RANGE[0]:.0%}–{PAPER_RANGE[1]:.0%} saved (OPT-13B, widths 2–6; "
        "§6.3, Fig. 15).",
    ]


def section_body(r: Results, png: Path | None, md: Path) -> str:
    lines = [*report.section_preamble("Beam search"),
             *([f"**{QUICK_NOTE}**", ""] if r.quick else []),
             *(report.list_item(line) for line in settings_lines(r)), "",
             report.markdown_table(target_rows(r)), "",
             "### KV blocks held per request", "", report.markdown_grid(*blocks_grid(r))]
    for workload, model in r.workloads.items():
        lines += ["", f"### `{workload}`: {model}", "",
                  report.markdown_grid(*throughput_grid(r, workload))]
    if png is not None:
        lines += ["", report.image_link(png, md, "beam search benchmark")]
    return "\n".join(lines)


def terminal_text(r: Results) -> str:
    parts = [QUICK_NOTE, ""] if r.quick else []
    parts += [report.text_table(target_rows(r)), "", "KV blocks held per request",
              report.text_grid(*blocks_grid(r))]
    for workload, model in r.workloads.items():
        parts += ["", f"{workload}: {model}", report.text_grid(*throughput_grid(r, workload))]
    return "\n".join(parts)


def write_json(r: Results, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / JSON_NAME
    path.write_text(json.dumps(asdict(r), indent=1) + "\n")
    return path
