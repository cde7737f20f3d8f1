"""What the allocator benchmark reports: the results table, the plot, its docs section."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.plot import pyplot, save_figure

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


def write_plot(r: Results, path: Path) -> None:
    batch = r.batch
    plt = pyplot()

    from matplotlib.ticker import FuncFormatter, NullFormatter

    figure, (rates, latency) = plt.subplots(1, 2, figsize=(13, 5.5))
    labels = ["core mix\nAllocator.step", "ExecutorPool\n.append", f"gRPC Step\n{batch} ops/RPC",
              "gRPC Step\n1 op/RPC"]
    values = [r.mix_ops_s, r.pool_append_s, r.batched_ops_s, r.per_op_ops_s]
    bars = rates.bar(labels, values, color=["#4c72b0", "#8fa9d6", "#dd8452", "#c44e52"])
    rates.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3)
    rates.hlines(CORE_TARGET_OPS_S, -0.4, 0.4, color="black", linestyle="--", linewidth=1)
    rates.text(0.43, CORE_TARGET_OPS_S, "target", va="center", fontsize=8)
    rates.hlines(BATCHED_TARGET_RATIO * r.per_op_ops_s, 1.6, 2.4, color="black", linestyle="--",
                 linewidth=1)
    rates.text(2.43, BATCHED_TARGET_RATIO * r.per_op_ops_s,
               f"target:\n{BATCHED_TARGET_RATIO:.0f}× per-op", va="center", fontsize=8)
    rates.set_yscale("log")
    rates.set_ylim(min(values) / 3, max(max(values), CORE_TARGET_OPS_S) * 4)
    rates.set_ylabel("block ops / s (log scale)")
    rates.set_title(f"Throughput (batched / per-op = {r.batched_ops_s / r.per_op_ops_s:.0f}×)")

    series = [("gRPC Step over loopback (client-side)", r.rpc_step, "#dd8452"),
              ("servicer handler in-process (no transport)", r.handler_step, "#55a868"),
              ("Allocator.step in-process", r.core_step, "#4c72b0")]
    for name, samples, color in series:
        ordered = sorted(s * 1e3 for s in samples)
        fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
        latency.step(ordered, fractions, where="post", color=color,
                     label=f"{name}: p50 {report.percentile(samples, 50) * 1e3:.2f} ms")
    latency.axvline(LATENCY_TARGET_P50_MS, color="black", linestyle="--", linewidth=1,
                    label=f"loopback p50 target: {LATENCY_TARGET_P50_MS:.0f} ms")
    latency.axhline(0.5, color="lightgrey", linewidth=0.8)
    latency.set_xscale("log")
    latency.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    latency.xaxis.set_minor_formatter(NullFormatter())
    latency.set_xticks([t for t in (0.2, 0.5, 1, 2, 5, 10, 20, 50)
                        if min(r.core_step) * 1e3 / 2 <= t <= max(r.rpc_step) * 1e3 * 2])
    latency.set_xlabel("time per step (ms, log scale)")
    latency.set_ylabel("fraction of steps")
    latency.set_title(f"One Step of {batch} appends: latency CDF ({len(r.rpc_step)} steps)")
    latency.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8,
                   frameon=False)
    figure.suptitle(f"pagedserve allocator, {report.today()}: {report.machine_description()}",
                    fontsize=10)
    save_figure(figure, path)


def section_body(r: Results, png: Path | None, md: Path) -> str:
    method = (
        f"One pool of {r.num_blocks:,} blocks × {r.block_size} slots. The core mix is a "
        f"scheduler-shaped stream of ops through `Allocator.step` (up to {r.batch} running "
        "sequences; prompts, half behind one of four shared 256-token system prompts, then one "
        "decoded token per step with the computed mark advancing and 4 slots reserved ahead, an "
        "occasional fork, a free at the end); every op counts as one block op. Over gRPC the "
        f"server is `python -m allocator_service` on loopback; the decode step is {r.batch} "
        "sequences appending one token each, sent as one `Step` or as one `Step` per op (the "
        "two alternate in rounds; request building is included). Latency is client-side time "
        "of the `Step` call, interleaved step by step with the same batch in-process. "
        "`--profile` prints where the in-process time goes (cProfile and a directly timed "
        "breakdown of one decode step).")
    lines = [
        textwrap.fill(f"Measured {report.today()} on {report.machine_description()}; 1-minute "
                      f"load average {r.load_at_start:.2f} when the run started.", 100),
        "",
        f"Command: `{report.command_line()}`",
        "",
        textwrap.fill(method, 100),
        "",
        report.markdown_table(result_rows(r)),
    ]
    if png is not None:
        lines += ["", report.image_link(png, md, "allocator benchmark")]
    return "\n".join(lines)
