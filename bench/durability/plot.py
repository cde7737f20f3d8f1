"""docs/img/durability_bench.png: Step latency by batch size, the durable/memory ratios against
the target, and the time to SERVING after kill -9 by what was left to replay."""
from __future__ import annotations

import statistics
import textwrap
from pathlib import Path

from bench import report
from bench.durability.config import CONFIGS, DURABLE, TARGET_BATCH, TARGET_RATIO
from bench.durability.report import Results, latency_ratio, ms, serving_s
from bench.plot import pyplot, save_figure


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    figure, (latency, ratios, recovery) = plt.subplots(1, 3, figsize=(17, 5.5))
    batches = list(r.latency)
    # Each configuration a little apart on the log axis, so the p50-p99 bars do not overlap.
    for offset, c in zip((-0.1, 0.0, 0.1), CONFIGS):
        xs = [b * (1 + offset) for b in batches]
        p50 = [ms(r.latency[b][c.name], 50) for b in batches]
        p90 = [ms(r.latency[b][c.name], 90) for b in batches]
        p99 = [ms(r.latency[b][c.name], 99) for b in batches]
        latency.plot(xs, p50, "o-", color=c.color, label=f"{c.label}: p50")
        latency.vlines(xs, p50, p99, color=c.color, alpha=0.35, linewidth=4)
        latency.plot(xs, p90, "_", color=c.color, markersize=10)
    latency.plot([], [], color="grey", alpha=0.35, linewidth=4, label="bar: p50 to p99, tick: p90")
    for axis in (latency, ratios):
        axis.set_xscale("log")
        axis.xaxis.set_major_locator(FixedLocator(batches))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_xlabel("decode appends per Step")
    latency.set_yscale("log")
    latency.yaxis.set_major_locator(FixedLocator([0.2, 0.5, 1, 2, 5, 10, 20, 50]))
    latency.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    latency.yaxis.set_minor_formatter(NullFormatter())
    latency.set_ylabel("Step latency, client-side over loopback (ms, log scale)")
    latency.set_title("Step latency by batch size")
    latency.legend(fontsize=8)

    for c in DURABLE:
        ratios.plot(batches, [latency_ratio(r, b, c.name) for b in batches], "o-",
                    color=c.color, label=f"{c.name}: p50")
        ratios.plot(batches, [latency_ratio(r, b, c.name, 99) for b in batches], "o--",
                    color=c.color, alpha=0.5, label=f"{c.name}: p99")
    ratios.plot([TARGET_BATCH / 1.6, TARGET_BATCH * 1.25], [TARGET_RATIO] * 2, color="black",
                linestyle="--", linewidth=1.2,
                label=f"target at {TARGET_BATCH}: p50 ≤ {TARGET_RATIO}×")
    ratios.axhline(1.0, color="lightgrey", linewidth=0.8)
    ratios.set_ylabel("durable / in memory")
    ratios.set_title("What the journal costs a Step")
    ratios.set_ylim(bottom=0)
    ratios.legend(fontsize=8)

    if r.recovery:
        labels = ["memory\n(baseline)"] + [textwrap.fill(p.label, 14) for p in r.recovery]
        serving = [statistics.median(r.start_baseline_s)] + [serving_s(p) for p in r.recovery]
        loads = [0.0] + [p.load_s for p in r.recovery]
        positions = range(len(labels))
        bars = recovery.bar(positions, serving, color="#8fa9d6", label="kill -9 → SERVING")
        recovery.bar(positions, loads, width=0.4, color="#4c72b0",
                     label="of which: load (snapshot + replay), in-process")
        recovery.bar_label(bars, labels=[f"{value:.2f} s" for value in serving], padding=2,
                           fontsize=8)
        recovery.set_xticks(list(positions), labels, fontsize=7)
        recovery.set_ylim(0, max(serving) * 1.25)
        recovery.set_ylabel("seconds")
        recovery.set_xlabel("killed with -9 after: journal since the last snapshot")
        recovery.set_title(f"Restart to SERVING (snapshot {r.snapshot_bytes / 1024:,.0f} KiB)")
        recovery.legend(fontsize=8, loc="upper left")

    figure.suptitle(f"pagedserve allocator durability, {report.today()}: "
                    f"{report.machine_description()}, Redis {r.redis_version}", fontsize=10)
    save_figure(figure, path)
