"""docs/img/memory_bench.png: per scheme, the share of allocated KV slots holding tokens and the
concurrent sequences while requests wait, and the sequences in the cache iteration by
iteration."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.memory.report import Results
from bench.memory.samples import CONTIGUOUS, POW2, SchemeRun
from bench.plot import pyplot, save_figure

COLORS = {CONTIGUOUS: "#dd8452", POW2: "#c4ad66"}
PAGED_COLOR = "#4c72b0"
# The largest block size, beside the headline one in the iteration-by-iteration panel.
LARGEST_BLOCK_COLOR = "#8172b3"
XLABEL = "contiguous reservation (orange), pagedserve by block size (blue)"


def short_label(run: SchemeRun) -> str:
    if run.name == CONTIGUOUS:
        return "max\nlength"
    if run.name == POW2:
        return "power\nof two"
    return f"paged\n{run.name.split('-')[1]}"


def color(run: SchemeRun) -> str:
    return COLORS.get(run.name, PAGED_COLOR)


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()

    s = r.settings
    figure, (shares, counts, series) = plt.subplots(1, 3, figsize=(17, 5),
                                                     width_ratios=(3, 3, 4))
    positions = range(len(r.runs))
    labels = [short_label(run) for run in r.runs]
    colors = [color(run) for run in r.runs]

    values = [run.slot_share() * 100 for run in r.runs]
    bars = shares.bar(positions, values, color=colors)
    shares.bar_label(bars, labels=[f"{value:.1f}%" for value in values], fontsize=8)
    shares.axhline(s.target_paged_share * 100, color="black", linestyle="--", linewidth=1,
                   label=f"target at block {s.headline_block_size}: "
                         f"{s.target_paged_share:.0%}")
    shares.set_ylim(0, 110)
    shares.set_xticks(positions, labels, fontsize=8)
    shares.set_ylabel("% of allocated KV slots holding a token")
    shares.set_xlabel(XLABEL, fontsize=8)
    shares.set_title("KV memory holding tokens (requests waiting)")
    shares.legend(fontsize=8, loc="upper left")

    means = [run.mean_sequences() for run in r.runs]
    maxima = [run.max_sequences() for run in r.runs]
    counts.bar(positions, means, color=colors)
    counts.plot(positions, maxima, "o", color="black", markersize=4, label="max")
    for position, mean, most, run in zip(positions, means, maxima, r.runs):
        counts.annotate(f"{mean:.0f}\n{r.vs_contiguous(run):.1f}×", (position, most),
                        xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8)
    counts.set_ylim(0, max(maxima) * 1.2)
    counts.axhline(r.run(CONTIGUOUS).mean_sequences() * s.target_concurrency_ratio,
                   color="black", linestyle="--", linewidth=1,
                   label=f"target: {s.target_concurrency_ratio:g}× contiguous")
    counts.set_xticks(positions, labels, fontsize=8)
    counts.set_ylabel("sequences holding KV memory (bar: mean, dot: max)")
    counts.set_xlabel(XLABEL, fontsize=8)
    counts.set_title(f"Concurrent sequences in {s.budget_slots:,} slots (requests waiting)")
    counts.legend(fontsize=8, loc="upper right")

    shown = [r.run(CONTIGUOUS), r.run(POW2), r.headline]
    largest = r.paged_runs[-1]
    if largest is not r.headline:
        shown.append(largest)
    for run in shown:
        series.plot(range(1, run.num_iterations + 1),
                    [sample.sequences for sample in run.samples], linewidth=1,
                    color=LARGEST_BLOCK_COLOR if run is largest and run is not r.headline
                    else color(run), label=f"{run.label} ({run.num_iterations:,} iterations)")
    series.set_xlabel("iteration")
    series.set_ylabel("sequences holding KV memory")
    series.set_title(f"All {s.num_requests} requests arrive at t = 0")
    series.legend(fontsize=8, loc="upper right")

    figure.suptitle(f"pagedserve KV memory, {report.today()}: {s.num_requests} chat-like "
                    f"requests, {s.budget_slots:,}-slot budget, max length "
                    f"{s.max_model_len:,}", fontsize=10)
    save_figure(figure, path)
