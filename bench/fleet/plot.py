"""docs/img/fleet_bench.png: against the number of replayed executors, the allocator's CPU
(cores) and its Step latency p99, for each iteration time and store."""
from __future__ import annotations

from pathlib import Path

from bench.fleet.report import TARGET_P99_MS, FleetResults
from bench.plot import pyplot, save_figure

COLORS = {("memory", 20.0): "#4c72b0", ("redis", 20.0): "#dd8452",
          ("memory", 5.0): "#55a868", ("redis", 5.0): "#c44e52"}


def write_plot(results: FleetResults, path: Path) -> None:
    plt = pyplot()
    figure, (cpu, latency) = plt.subplots(1, 2, figsize=(13, 5.5))
    for recording in results.recordings:
        it = recording.iteration_ms
        for store in ("memory", "redis"):
            points = results.of(it, store)
            if not points:
                continue
            label = f"{it:g} ms iterations, {store}"
            color = COLORS.get((store, it))
            xs = [p.executors for p in points]
            cpu.plot(xs, [(p.result.allocator_cpu_s or 0) / p.result.window_s for p in points],
                     marker="o", label=label, color=color)
            latency.plot(xs, [p.p99_ms for p in points], marker="o", label=label, color=color)
            for p in points:
                if p.result.stalls:
                    latency.annotate(f"{p.result.stalls} stalls", (p.executors, p.p99_ms),
                                     fontsize=7, xytext=(3, 3), textcoords="offset points")
    cpu.axhline(1.0, color="black", linestyle="--", linewidth=1)
    cpu.text(0.01, 1.0, " one core", va="bottom", transform=cpu.get_yaxis_transform(), fontsize=8)
    cpu.set(xlabel="replayed executors (N)", ylabel="allocator CPU (cores, from /proc)",
            title="Allocator CPU against fleet size")
    latency.axhline(TARGET_P99_MS, color="black", linestyle="--", linewidth=1)
    latency.set(xlabel="replayed executors (N)", ylabel="Step latency p99 (ms)", yscale="log",
                title="Step latency p99 against fleet size")
    for axes in (cpu, latency):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle("One allocator process under replayed executor Step streams")
    save_figure(figure, path)
