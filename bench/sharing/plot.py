"""docs/img/sharing_bench.png: KV blocks in use over the iterations of the largest-n parallel
sampling run and of the system prompt run, each with and without sharing; and the saving of
every case (mean and peak) beside what the lengths predict and the vLLM paper's range."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.plot import pyplot, save_figure
from bench.sharing.report import PAPER_PARALLEL_RANGE, Results
from bench.sharing.workload import PARALLEL, SYSTEM

UNSHARED_COLOR, SHARED_COLOR = "#dd8452", "#4c72b0"


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()

    figure, (over_time, savings) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=(3, 2))
    shown = r.of_kind(PARALLEL)[-1:] + r.of_kind(SYSTEM)
    for pair, style in zip(shown, ("-", "--")):
        for runs, color, mode in ((pair.best_unshared, UNSHARED_COLOR, "not shared"),
                                  (pair.best_shared, SHARED_COLOR, "shared")):
            over_time.plot([used for used, _ in runs.blocks], style, color=color,
                           linewidth=1.4, label=f"{pair.case.label}, {mode}")
    over_time.set_xlabel("engine iteration")
    over_time.set_ylabel("KV blocks in use (held by some sequence)")
    over_time.set_ylim(bottom=0)
    over_time.set_title(f"Blocks in use, all requests submitted at once ({r.num_blocks:,} "
                        "blocks in the cache)")
    over_time.legend(fontsize=8, loc="center right", framealpha=0.95)

    positions = range(len(r.pairs))
    width = 0.38
    mean = [pair.mean_saving * 100 for pair in r.pairs]
    peak = [pair.peak_saving * 100 for pair in r.pairs]
    bars = savings.bar([x - width / 2 for x in positions], mean, width, color=SHARED_COLOR,
                       label="mean over the run (time-weighted)")
    savings.bar_label(bars, fmt="%.0f%%", fontsize=7, padding=1)
    bars = savings.bar([x + width / 2 for x in positions], peak, width, color="#a6bddb",
                       label="at the peak")
    savings.bar_label(bars, fmt="%.0f%%", fontsize=7, padding=1)
    savings.plot(list(positions), [pair.case.expected_peak_saving() * 100 for pair in r.pairs],
                 "k_", markersize=18, markeredgewidth=2, label="peak the lengths predict")
    low, high = PAPER_PARALLEL_RANGE
    parallel = len(r.of_kind(PARALLEL))
    if parallel:
        savings.fill_between([-0.5, parallel - 0.5], low * 100, high * 100, color="#bbbbbb",
                             alpha=0.4, zorder=0, label="vLLM paper, parallel sampling "
                                                        "(Fig. 15)")
    savings.set_xticks(list(positions), [pair.case.label.replace(" (", "\n(").replace(
        "sampling ", "sampling\n") for pair in r.pairs], fontsize=8)
    savings.set_ylim(0, 100)
    savings.set_ylabel("KV blocks saved by sharing (%)")
    savings.set_title("Saved = 1 − shared / not shared")
    savings.legend(fontsize=7, loc="upper left")

    figure.suptitle(f"pagedserve KV sharing, {report.today()}: {r.model}, float32, cpu",
                    fontsize=10)
    save_figure(figure, path)
