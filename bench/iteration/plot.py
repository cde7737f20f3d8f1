"""docs/img/iteration_bench.png: one column per batch size, a bar per contender stacking the median
time of each phase of an iteration; the lower row leaves the forward pass out, so the host phases
beside it can be read. Medians, not means: on a shared machine a slow spell, or a garbage
collection that lands in one phase, would make that phase's mean a picture of the spell. The
medians of the phases need not add up to the median iteration, only come close; the label on
each bar is their sum."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.iteration.probe import FORWARD, PHASES
from bench.iteration.report import PHASE_LABELS, Results
from bench.plot import pyplot, save_figure

COLORS = dict(zip(PHASES, ["#8172b3", "#c44e52", "#dd8452", "#937860", "#4c72b0", "#55a868",
                           "#da8bc3"]))


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()
    batches = r.settings.batch_sizes
    figure, panels = plt.subplots(2, len(batches), figsize=(3 * len(batches) + 4, 8),
                                  squeeze=False)
    for column, batch in enumerate(batches):
        stack(r, panels[0][column], batch, PHASES, f"batch {batch}")
        stack(r, panels[1][column], batch, [p for p in PHASES if p != FORWARD],
              f"batch {batch}: outside the forward")
    panels[0][0].set_ylabel("ms per decode iteration (median of each phase)")
    panels[1][0].set_ylabel("ms outside the forward (median of each phase)")
    handles, names = panels[0][0].get_legend_handles_labels()
    # Beside the last panel: save_figure's tight layout makes room for it.
    panels[0][-1].legend(handles[::-1], names[::-1], fontsize=8, loc="upper left",
                         bbox_to_anchor=(1.02, 1.0))
    figure.suptitle(f"pagedserve engine iteration by phase, {report.today()}: {r.model}, "
                    f"float32, CPU, torch threads: {r.threads}", fontsize=10)
    save_figure(figure, path)


def stack(r: Results, panel, batch: int, phases, title: str) -> None:
    labels = r.labels
    bottoms = [0.0] * len(labels)
    for phase in phases:
        heights = [r.median_ms(batch, label, phase) for label in labels]
        panel.bar(range(len(labels)), heights, bottom=bottoms, color=COLORS[phase], width=0.6,
                  label=PHASE_LABELS[phase].replace("`", ""))
        bottoms = [bottom + height for bottom, height in zip(bottoms, heights)]
    totals = bottoms
    for position, value in enumerate(totals):
        panel.annotate(f"{value:.3g} ms", (position, value), ha="center", va="bottom",
                       fontsize=8, xytext=(0, 2), textcoords="offset points")
    panel.set_xticks(range(len(labels)), labels, fontsize=8)
    panel.set_xlim(-0.7, len(labels) - 0.3)
    panel.set_ylim(0, max(totals) * 1.15)
    panel.set_title(title, fontsize=9)
