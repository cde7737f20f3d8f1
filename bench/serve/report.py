"""What the serving benchmark reports: every run of every contender at every rate, the rows with
the target and the sanity checks, the grids (throughput, latency, CPU), the raw JSON and its
`## Serving` section of docs/benchmarks.md. The plot is plot.py; how the benchmark measures is
written once, by hand, in docs/benchmarks.md (`## Serving: how it is measured`)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.serve.metrics import Run, align_http, summary_ms
from bench.serve.workload import ServeSettings, rate_label
from bench.throughput.workload import Workload

ENGINE, GRPC, HTTP = "engine", "grpc", "http"
CONTENDERS = (ENGINE, GRPC, HTTP)
LABELS = {ENGINE: "in-process engine", GRPC: "full stack, gRPC", HTTP: "full stack, HTTP"}
# Processes whose CPU time is reported, in this order. "benchmark" is this process: the clients
# (the load generator) in the stack's runs, the engine itself in the in-process runs.
PROCESSES = ("benchmark", "gateway", "executor", "allocator")


@dataclass(slots=True)
class Results:
    settings: ServeSettings
    workload: Workload
    model: str
    device: str
    runs: list[Run] = field(default_factory=list)

    def runs_of(self, contender: str, rate: float) -> list[Run]:
        return [run for run in self.runs if run.contender == contender and run.rate == rate]

    def best(self, contender: str, rate: float) -> Run:
        return max(self.runs_of(contender, rate), key=lambda run: run.tokens_per_s)

    def ratio(self, contender: str, rate: float) -> float:
        """`contender` over the in-process engine, output tokens/s of the best runs."""
        return self.best(contender, rate).tokens_per_s / self.best(ENGINE, rate).tokens_per_s

    @property
    def headline_rate(self) -> float:
        return self.settings.headline_rate

    @property
    def exact_dtype(self) -> bool:
        # Only float32 is expected to pick the same greedy tokens whatever the batch around a
        # request; half precision's rounding flips near-ties (as in bench/throughput/report.py).
        return self.settings.dtype == "float32"

    def align_http_runs(self) -> None:
        """Counts the tokens of every HTTP chunk from the first gRPC run's deltas."""
        reference = next(run for run in self.runs if run.contender == GRPC)
        for run in self.runs:
            if run.contender == HTTP:
                run.unaligned = sum(not align_http(trace, grpc_trace)
                                    for trace, grpc_trace in zip(run.traces, reference.traces))

    # -- sanity --------------------------------------------------------------------------------

    def exact_lengths(self) -> tuple[int, int]:
        """Requests, over every run, that returned exactly the tokens they asked for."""
        wanted = self.workload.output_lens
        good = sum(not trace.error and trace.num_tokens == want == trace.reported_tokens
                   for run in self.runs for trace, want in zip(run.traces, wanted))
        return good, len(self.runs) * len(wanted)

    def grpc_equal_engine(self) -> tuple[int, int]:
        reference = self.runs_of(ENGINE, self.settings.request_rates[0])[0]
        pairs = [(trace.token_ids, mine.token_ids) for run in self.runs if run.contender == GRPC
                 for trace, mine in zip(run.traces, reference.traces)]
        return sum(theirs == ours for theirs, ours in pairs), len(pairs)

    def http_equal_grpc(self) -> tuple[int, int]:
        reference = next(run for run in self.runs if run.contender == GRPC)
        pairs = [(trace.text, mine.text) for run in self.runs if run.contender == HTTP
                 for trace, mine in zip(run.traces, reference.traces)]
        return sum(theirs == ours for theirs, ours in pairs), len(pairs)


def target_rows(r: Results) -> list[report.Row]:
    rate, target = r.headline_rate, r.settings.target_ratio
    streams = f"{r.settings.max_concurrency} concurrent streams"
    grpc_ratio, http_ratio = r.ratio(GRPC, rate), r.ratio(HTTP, rate)
    return [
        report.Row(f"full stack (gRPC) / in-process engine, output tokens/s at {streams}",
                   f"{grpc_ratio:.2f}", f"≥ {target:.2f}", grpc_ratio >= target),
        report.Row(f"full stack (HTTP) / in-process engine, output tokens/s at {streams}",
                   f"{http_ratio:.2f}"),
    ]


def sanity_rows(r: Results) -> list[report.Row]:
    Row = report.Row
    good, total = r.exact_lengths()
    rows = [Row("requests that returned exactly their requested tokens, every run (sanity "
                "check)", f"{good:,} of {total:,}", f"all {total:,}", good == total)]
    same, total = r.grpc_equal_engine()
    rows.append(Row("requests whose greedy tokens through gRPC equal the in-process engine's",
                    f"{same:,} of {total:,}", f"all {total:,}" if r.exact_dtype else "",
                    same == total if r.exact_dtype else None))
    same, total = r.http_equal_grpc()
    rows.append(Row("requests whose greedy text through HTTP equals gRPC's",
                    f"{same:,} of {total:,}", f"all {total:,}" if r.exact_dtype else "",
                    same == total if r.exact_dtype else None))
    unaligned = sum(run.unaligned for run in r.runs)
    if unaligned:
        rows.append(Row("HTTP requests whose chunks did not line up with gRPC's deltas (ITL "
                        "counted one token per chunk)", f"{unaligned}"))
    return rows


def result_rows(r: Results) -> list[report.Row]:
    rate = r.headline_rate
    rows = target_rows(r)
    rows += [report.Row(f"{LABELS[name]}: output tokens/s at rate {rate_label(rate)} "
                        f"(best of {len(r.runs_of(name, rate))})",
                        f"{r.best(name, rate).tokens_per_s:,.0f}") for name in CONTENDERS]
    for name in (GRPC, HTTP):
        costs = cpu_costs(r.best(name, rate))
        rows.append(report.Row(f"{LABELS[name]}: CPU µs per output token at rate "
                               f"{rate_label(rate)}: " + " / ".join(PROCESSES),
                               " / ".join(costs)))
    return rows + sanity_rows(r)


def failed_checks(r: Results) -> list[report.Row]:
    """Sanity checks that failed (a missed target is a result, not a failure)."""
    return [row for row in sanity_rows(r) if row.met is False]


def cpu_costs(run: Run) -> list[str]:
    costs = [run.cpu_us_per_token(process) for process in PROCESSES]
    return ["—" if cost is None else f"{cost:,.0f}" for cost in costs]


def _runs_in_order(r: Results) -> list[tuple[float, str, Run]]:
    return [(rate, name, r.best(name, rate)) for rate in r.settings.request_rates
            for name in CONTENDERS]


def throughput_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["rate (req/s)", "contender", "completed", "duration", "requests/s",
              "output tokens/s", "over in-process", "every round (tokens/s)"]
    rows = []
    for rate, name, best in _runs_in_order(r):
        rows.append([rate_label(rate), LABELS[name], f"{best.completed}",
                     f"{best.wall_s:.1f} s", f"{best.requests_per_s:.2f}",
                     f"{best.tokens_per_s:,.0f}",
                     "—" if name == ENGINE else f"{r.ratio(name, rate):.2f}",
                     " / ".join(f"{run.tokens_per_s:,.0f}" for run in r.runs_of(name, rate))])
    return header, rows


def latency_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["rate (req/s)", "contender"] + [f"{metric} {stat} (ms)" for metric in
                                              ("TTFT", "TPOT", "ITL")
                                              for stat in ("mean", "median", "p99")]
    rows = []
    for rate, name, best in _runs_in_order(r):
        cells = [rate_label(rate), LABELS[name]]
        for samples in (best.ttfts_s(), best.tpots_s(), best.itls_s()):
            summary = summary_ms(samples)
            cells += [_ms(summary[stat]) for stat in ("mean", "median", "p99")]
        rows.append(cells)
    return header, rows


def cpu_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["rate (req/s)", "contender", *(f"{p} (µs/token)" for p in PROCESSES),
              "cores busy"]
    rows = []
    for rate, name, best in _runs_in_order(r):
        costs = cpu_costs(best)
        if name == ENGINE:   # the services idle meanwhile; their heartbeats are not its cost
            costs = costs[:1] + ["—"] * (len(costs) - 1)
            busy = best.cpu_s.get(PROCESSES[0], 0.0) / best.wall_s
        else:
            busy = sum(best.cpu_s.values()) / best.wall_s
        rows.append([rate_label(rate), LABELS[name], *costs, f"{busy:.2f}"])
    return header, rows


def _ms(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:,.1f}"


def target_lines(r: Results) -> list[str]:
    grpc, http = target_rows(r)
    lines = [f"{grpc.metric}: {grpc.measured} (target {grpc.target}): "
             f"{'met' if grpc.met else 'NOT met'}"]
    meets = float(http.measured) >= r.settings.target_ratio
    lines.append(f"{http.metric}: {http.measured} (the target is judged on gRPC; HTTP "
                 f"{'meets it too' if meets else 'does not meet it'})")
    return lines


def rates_text(settings: ServeSettings) -> str:
    finite = [rate_label(rate) for rate in settings.request_rates if not math.isinf(rate)]
    parts = []
    if any(math.isinf(rate) for rate in settings.request_rates):
        parts.append("∞ (all at once)")
    if finite:
        parts.append(f"Poisson arrivals at {' and '.join(finite)} requests/s")
    return ", and ".join(parts)


def settings_lines(r: Results) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    s, w = r.settings, r.workload
    lengths = sorted(len(prompt) for prompt in w.prompts)
    rounds = {1: "once", 2: "twice"}.get(s.rounds, f"{s.rounds} times")
    return [
        f"Model `{r.model}`, {s.dtype}, on {r.device}; both engines: block size 16, a KV cache "
        f"of {s.kv_cache_bytes // 2**20:,} MiB, {s.max_batched_tokens} tokens per iteration at "
        f"most, {s.max_num_seqs} sequences at most; the load generator on the same "
        f"{os.cpu_count()} cores as the stack.",
        f"{len(w.prompts)} requests at each request rate: {rates_text(s)}, at most "
        f"{s.max_concurrency} open at a time.",
        f"Prompt lengths {s.prompt_lens.describe()} (drawn: {report.drawn_lengths(lengths)}; "
        f"{w.num_prompt_tokens:,} prompt tokens); output {s.output_lens.describe()} tokens per "
        f"request ({w.num_output_tokens:,} in all).",
        f"Every contender serves rate {rate_label(s.headline_rate)} {rounds}, the run with the "
        "most output tokens/s counting, and every other rate once.",
    ]


def section_body(r: Results, png: Path | None, md: Path) -> str:
    machine = (f"Measured {report.today()} on {report.machine_description()}"
               + ("" if r.device == "cpu" else f", {r.device}") + ".")
    lines = [
        *report.section_preamble("Serving", machine),
        *(report.list_item(line) for line in settings_lines(r)), "",
        *(f"- **{line}**" for line in target_lines(r)), "",
        report.markdown_table(result_rows(r)), "",
        report.markdown_grid(*throughput_grid(r)), "",
        report.markdown_grid(*latency_grid(r)), "",
        report.markdown_grid(*cpu_grid(r)),
    ]
    if png is not None:
        lines += ["", report.image_link(png, md, "serving benchmark")]
    return "\n".join(lines)


def write_json(r: Results, directory: Path) -> Path:
    """The raw numbers, for scripts that gather several benchmarks (bench/gpu_all.sh)."""
    s = r.settings
    data = {
        "preset": s.name, "model": r.model, "device": r.device, "dtype": s.dtype,
        "num_requests": len(r.workload.prompts), "max_concurrency": s.max_concurrency,
        "request_rates": [rate_label(rate) for rate in s.request_rates],
        "prompt_lens": [len(prompt) for prompt in r.workload.prompts],
        "output_lens": r.workload.output_lens,
        "runs": [{"contender": run.contender, "rate": rate_label(run.rate),
                  "round": run.round_index, "wall_s": run.wall_s,
                  "completed": run.completed, "output_tokens": run.output_tokens,
                  "tokens_per_s": run.tokens_per_s, "requests_per_s": run.requests_per_s,
                  "ttft_ms": _json(summary_ms(run.ttfts_s())),
                  "tpot_ms": _json(summary_ms(run.tpots_s())),
                  "itl_ms": _json(summary_ms(run.itls_s())), "cpu_s": run.cpu_s}
                 for run in r.runs],
        "over_in_process": {name: {rate_label(rate): r.ratio(name, rate)
                                   for rate in s.request_rates} for name in (GRPC, HTTP)},
        "rows": [{"metric": row.metric, "measured": row.measured, "target": row.target,
                  "met": row.met} for row in result_rows(r)],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "serve_bench.json"
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    return path


def _json(summary: dict[str, float]) -> dict[str, float | None]:
    """NaN (no samples) as null: strict JSON has no NaN."""
    return {key: None if math.isnan(value) else value for key, value in summary.items()}
