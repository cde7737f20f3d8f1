"""docs/img/allocator_bench.png: the throughputs (core mix, `ExecutorPool.append`, gRPC batched
and per op) against their targets, and the latency CDF of one decode Step over loopback, through
the servicer's handler and through `Allocator.step` in-process."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.allocator.report import (BATCHED_TARGET_RATIO, CORE_TARGET_OPS_S, LATENCY_TARGET_P50_MS,
                                    Results)
from bench.plot import pyplot, save_figure


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
