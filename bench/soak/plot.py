"""docs/img/soak_memory.png: each process's resident memory over the soak, the allocator's
restart marked, and the two windows the stability check compares shaded."""
from __future__ import annotations

from pathlib import Path

from bench.plot import pyplot, save_figure
from bench.soak.memory import EARLY, LATE, MemorySamples

COLORS = {"allocator": "#4c72b0", "executor": "#dd8452", "gateway": "#55a868", "redis": "#c44e52"}


def write_plot(memory: MemorySamples, restarts: list[tuple[float, float]], path: Path) -> None:
    """One panel per process, each on its own linear scale, so a slow growth shows."""
    plt = pyplot()

    names = list(memory.rss_mib)
    columns = 2
    rows = max(1, (len(names) + columns - 1) // columns)
    figure, panels = plt.subplots(rows, columns, figsize=(11, 3.2 * rows), sharex=True,
                                  squeeze=False)
    minutes = [at / 60 for at in memory.times]
    span = minutes[-1] if minutes else 0.0
    for axes, name in zip(panels.flat, names):
        series = [float("nan") if value is None else value for value in memory.rss_mib[name]]
        axes.plot(minutes, series, color=COLORS.get(name), linewidth=1.5)
        for low, high in (EARLY, LATE):
            axes.axvspan(low * span, high * span, color="grey", alpha=0.12)
        for at, away in restarts:
            axes.axvline(at / 60, color="black", linestyle="--", linewidth=1)
        axes.set_title(name, fontsize=10)
        axes.set_ylabel("RSS (MiB)")
        axes.grid(True, alpha=0.3)
        low = min((value for value in series if value == value), default=0.0)
        high = max((value for value in series if value == value), default=1.0)
        axes.set_ylim(0, max(high * 1.15, low + 1))
    for axes in panels.flat[len(names):]:
        axes.set_visible(False)
    for axes in panels[-1]:
        axes.set_xlabel("minutes into the soak")
    restart = (f"; dashed: allocator kill -9 (away {restarts[0][1]:.1f} s)" if restarts else "")
    figure.suptitle("Resident memory per process under mixed load with cancels "
                    f"(shaded: the windows compared{restart})", fontsize=10)
    save_figure(figure, path)
