"""What the allocator benchmark reports: the results table and its `## Allocator` section of
docs/benchmarks.md. The plot is plot.py; how the benchmark measures is written once, by hand, in
docs/benchmarks.md (`## Allocator: how it is measured`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench import report

CORE_TARGET_OPS_S = 300_000
BATCHED_TARGET_RATIO = 20.0
LATENCY_TARGET_P50_MS = 2.0


@dataclass(slots=True)
class Results:
    # Pool geometry and decode batch the numbers were measured with.
    num_blocks: int
    block_size: int
    batch: int
    # 1-minute load average when the run started: other work sharing the machine.
    load_at_start: float = float("nan")
    mix_ops_s: float = 0.0
    # Ops of the timed serving mix, by op class name.
    mix_counts: dict[str, int] = field(default_factory=dict)
    pool_append_s: float = 0.0
    batched_ops_s: float = 0.0
    per_op_ops_s: float = 0.0
    # Per-step timings of one decode Step (`batch` appends), in seconds, measured in turn:
    # over loopback (client-side), Allocator.step in-process, the servicer's handler in-process,
    # and protobuf serialize + parse of the handler's request and response.
    rpc_step: list[float] = field(default_factory=list)
    core_step: list[float] = field(default_factory=list)
    handler_step: list[float] = field(default_factory=list)
    wire_step: list[float] = field(default_factory=list)
    # Full (generation 2) garbage collections of the benchmark process during those steps.
    gc_full_pauses: list[float] = field(default_factory=list)
    num_not_ok: int = 0


def result_rows(r: Results) -> list[report.Row]:
    Row, batch = report.Row, r.batch
    rpc, core = report.summary_ms(r.rpc_step), report.summary_ms(r.core_step)
    handler, wire = report.summary_ms(r.handler_step), report.summary_ms(r.wire_step)
    counts = r.mix_counts
    total_ops = sum(counts.values()) or 1
    mix = ", ".join(f"{kind.removesuffix('Op').lower()} {counts.get(kind, 0) / total_ops:.2%}"
                    for kind in ("AllocateOp", "AppendOp", "ForkOp", "FreeOp"))
    ratio = r.batched_ops_s / r.per_op_ops_s
    transport = rpc["p50"] - handler["p50"] - wire["p50"]
    return [
        Row("core: serving mix through `Allocator.step` (block ops/s)", f"{r.mix_ops_s:,.0f}",
            f"≥ {CORE_TARGET_OPS_S:,}", r.mix_ops_s >= CORE_TARGET_OPS_S),
        Row("core: op mix (share of ops)", mix),
        Row("core: `ExecutorPool.append` alone (appends/s)", f"{r.pool_append_s:,.0f}"),
        Row(f"gRPC: batched `Step`, {batch} appends per RPC (ops/s)", f"{r.batched_ops_s:,.0f}"),
        Row("gRPC: one `Step` RPC per op (ops/s)", f"{r.per_op_ops_s:,.0f}"),
        Row("gRPC: batched / one RPC per op", f"{ratio:.1f}×", f"≥ {BATCHED_TARGET_RATIO:.0f}×",
            ratio >= BATCHED_TARGET_RATIO),
        Row(f"`Step` latency, {batch} appends, loopback: p50", f"{rpc['p50']:.2f} ms",
            f"≤ {LATENCY_TARGET_P50_MS:.0f} ms", rpc["p50"] <= LATENCY_TARGET_P50_MS),
        Row(f"`Step` latency, {batch} appends, loopback: p99 / mean",
            f"{rpc['p99']:.2f} / {rpc['mean']:.2f} ms"),
        Row(f"in-process `Allocator.step`, same {batch} appends: p50 / p99 / mean",
            f"{core['p50']:.2f} / {core['p99']:.2f} / {core['mean']:.2f} ms"),
        Row("RPC hop: loopback p50 / in-process p50", f"{rpc['p50'] / core['p50']:.2f}×"),
        Row("in-process tail: full GC pauses of the bench process during these steps",
            f"{len(r.gc_full_pauses)}, longest {max(r.gc_full_pauses, default=0) * 1e3:.1f} ms"),
        Row("loopback p50, part 1: servicer handler in-process (convert, digest, core)",
            f"{handler['p50']:.2f} ms"),
        Row("loopback p50, part 2: protobuf serialize + parse (request and response)",
            f"{wire['p50']:.2f} ms"),
        Row("loopback p50, part 3: the rest (gRPC runtime, transport, client)",
            f"{transport:.2f} ms"),
        Row("ops whose result was not OK (sanity check)", f"{r.num_not_ok}", "0",
            r.num_not_ok == 0),
    ]


def settings_lines(r: Results) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    return [f"One pool of {r.num_blocks:,} blocks × {r.block_size} slots; up to {r.batch} "
            f"running sequences in the core mix, {r.batch} appends per decode `Step`."]


def section_body(r: Results, png: Path | None, md: Path) -> str:
    lines = [
        *report.section_preamble("Allocator", f"Measured {report.today()} on "
                                 f"{report.machine_description()}; 1-minute load average "
                                 f"{r.load_at_start:.2f} when the run started."),
        *(report.list_item(line) for line in settings_lines(r)),
        "",
        report.markdown_table(result_rows(r)),
    ]
    if png is not None:
        lines += ["", report.image_link(png, md, "allocator benchmark")]
    return "\n".join(lines)
