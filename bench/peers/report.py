"""The `## Peers` section of docs/benchmarks.md, the terminal tables and the raw JSON: per
workload, both contenders' throughput and latency (each the median over the rounds), their
ratio pagedserve / vLLM, and how many greedy outputs agreed."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import report
from bench.peers.client import BenchResult, ClientSettings
from bench.peers.stacks import CONTENDERS, PAGEDSERVE, VLLM

LABELS = {PAGEDSERVE: "pagedserve", VLLM: "vLLM"}
JSON_NAME = "peers_bench.json"
QUICK_NOTE = ("A validation run (--quick: few prompts, one round), which proves the path end to "
              "end; not the measurement (`make bench-peers`).")
# Below this (ms, tokens/s) a figure is printed but not divided.
MEANINGFUL = 0.05


@dataclass(slots=True)
class Run:
    contender: str
    round_index: int
    # Which of the round's runs it was (0: first), so the alternation is on record.
    position: int
    result: BenchResult


@dataclass(slots=True)
class Agreement:
    same: int
    total: int
    max_tokens: int


@dataclass(slots=True)
class WorkloadResult:
    name: str
    model: str
    num_parameters: int
    vocab_size: int
    agreement: Agreement | None = None
    runs: list[Run] = field(default_factory=list)

    def runs_of(self, contender: str) -> list[Run]:
        return [run for run in self.runs if run.contender == contender]

    def median(self, contender: str, value) -> float:  # noqa: ANN001 - BenchResult -> float
        return statistics.median(value(run.result) for run in self.runs_of(contender))


@dataclass(slots=True)
class Results:
    client: ClientSettings
    # The settings both servers were given alike (stacks.ServerSettings, without the model).
    server: dict
    rounds: int
    vllm_version: str
    workloads: list[WorkloadResult] = field(default_factory=list)
    # Set for a --quick run, whose section says it is a smoke run, not the measurement.
    quick: bool = False


# (label, how to read it from a BenchResult, format); ratios are pagedserve over vLLM.
ROWS = (
    ("output tokens/s", lambda r: r.output_throughput, "{:,.0f}"),
    ("requests/s", lambda r: r.request_throughput, "{:,.2f}"),
    *((f"{metric.upper()} {stat} (ms)", lambda r, m=metric, s=stat: r.latency_ms[m][s],
       "{:,.1f}") for metric in ("ttft", "tpot", "itl") for stat in ("median", "p99")),
)


def workload_grid(w: WorkloadResult) -> tuple[list[str], list[list[str]]]:
    header = ["metric (median over rounds)", LABELS[PAGEDSERVE], LABELS[VLLM],
              "pagedserve / vLLM"]
    rows = []
    for label, value, fmt in ROWS:
        ours, theirs = w.median(PAGEDSERVE, value), w.median(VLLM, value)
        rows.append([label, fmt.format(ours), fmt.format(theirs), ratio_text(ours, theirs)])
    rows.append(["output tokens/s, every round",
                 *(" / ".join(f"{run.result.output_throughput:,.0f}" for run in w.runs_of(name))
                   for name in CONTENDERS), "—"])
    rows.append(["failed requests, all rounds",
                 *(f"{sum(run.result.failed for run in w.runs_of(name))}"
                   for name in CONTENDERS), "—"])
    return header, rows


def ratio_text(ours: float, theirs: float) -> str:
    """pagedserve / vLLM; none when either is under 0.05 (a latency the client measured as
    about zero: tokens that arrived in one read), where a ratio says nothing."""
    return "—" if min(ours, theirs) < MEANINGFUL else f"{ours / theirs:.2f}"


def agreement_line(w: WorkloadResult) -> str:
    a = w.agreement
    if a is None:
        return "Greedy agreement: not checked."
    return (f"Greedy agreement: {a.same} of {a.total} prompts got the same text from both "
            f"({a.max_tokens} tokens each, temperature 0).")


def workload_title(w: WorkloadResult) -> str:
    return (f"`{w.name}`: {w.model}, {w.num_parameters / 1e6:,.1f}M parameters, vocabulary "
            f"{w.vocab_size:,}")


def settings_lines(r: Results) -> list[str]:
    c, s = r.client, r.server
    rounds = {1: "once", 2: "twice"}.get(r.rounds, f"{r.rounds} times")
    return [
        f"Client: `vllm bench serve` (vLLM {r.vllm_version}), random dataset, "
        f"{c.num_prompts} prompts of {c.input_len} tokens, {c.output_len} output tokens each "
        f"(end-of-sequence ignored, temperature 0), all at once, at most {c.max_concurrency} "
        "open; every round has its own dataset seed, the same for both contenders.",
        f"Both servers: {s['dtype']}, block size {s['block_size']}, a KV cache of "
        f"{s['kv_cache_gib']} GiB, at most {s['max_num_seqs']} sequences and "
        f"{s['max_num_batched_tokens']} tokens per step; the client on the same "
        "cores as the servers.",
        f"Each contender served each workload {rounds}, the order alternating from round to "
        "round; every figure is the median over the rounds.",
    ]


def ratio_lines(r: Results) -> list[str]:
    lines = []
    for w in r.workloads:
        value = ROWS[0][1]
        ratio = w.median(PAGEDSERVE, value) / w.median(VLLM, value)
        lines.append(f"`{w.name}`: pagedserve / vLLM output tokens/s: {ratio:.2f}")
    return lines


def section_body(r: Results, png: Path | None, md: Path) -> str:
    lines = [
        *report.section_preamble("Peers"),
        *([f"**{QUICK_NOTE}**", ""] if r.quick else []),
        *(report.list_item(line) for line in settings_lines(r)), "",
        *(f"- **{line}**" for line in ratio_lines(r)),
    ]
    for w in r.workloads:
        lines += ["", f"### {workload_title(w)}", "", report.markdown_grid(*workload_grid(w)),
                  "", agreement_line(w)]
    if png is not None:
        lines += ["", report.image_link(png, md, "peer benchmark")]
    return "\n".join(lines)


def terminal_text(r: Results) -> str:
    parts = [QUICK_NOTE, ""] if r.quick else []
    for w in r.workloads:
        parts += [workload_title(w).replace("`", ""), report.text_grid(*workload_grid(w)),
                  agreement_line(w), ""]
    return "\n".join(parts + ratio_lines(r))


def to_json(r: Results) -> dict:
    return {"client": asdict(r.client), "server": r.server, "rounds": r.rounds,
            "vllm_version": r.vllm_version, "quick": r.quick,
            "workloads": [{"name": w.name, "model": w.model, "num_parameters": w.num_parameters,
                           "vocab_size": w.vocab_size,
                           "agreement": None if w.agreement is None else asdict(w.agreement),
                           "runs": [{"contender": run.contender, "round": run.round_index,
                                     "position": run.position, **run.result.to_json()}
                                    for run in w.runs]}
                          for w in r.workloads]}


def from_json(data: dict) -> Results:
    results = Results(ClientSettings(**data["client"]), data["server"], data["rounds"],
                      data["vllm_version"], quick=data.get("quick", False))
    for w in data["workloads"]:
        runs = [Run(run.pop("contender"), run.pop("round"), run.pop("position"),
                    BenchResult.from_json(run)) for run in (dict(x) for x in w["runs"])]
        agreement = None if w["agreement"] is None else Agreement(**w["agreement"])
        results.workloads.append(WorkloadResult(w["name"], w["model"], w["num_parameters"],
                                                w["vocab_size"], agreement, runs))
    return results


def write_json(r: Results, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / JSON_NAME
    path.write_text(json.dumps(to_json(r), indent=1) + "\n")
    return path
