"""The grammar benchmark's figure: compile time and per-token mask time, per constraint and
engine, on log scales (the engines differ by orders of magnitude)."""
from __future__ import annotations

from pathlib import Path

from bench.grammar.report import Results
from bench.plot import pyplot, save_figure


def write_plot(results: Results, path: Path) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    constraints, engines = list(results.tokens), list(results.engines)
    width = 0.8 / max(1, len(engines))
    for axis, (title, value) in zip(axes, [("compile (ms)", results.compile_ms),
                                           ("mask per token (µs)", results.mask_us)]):
        for i, engine in enumerate(engines):
            values = [value(engine, c) or 0.0 for c in constraints]
            axis.bar([x + i * width for x in range(len(constraints))], values, width,
                     label=engine)
        axis.set_title(title)
        axis.set_yscale("log")
        axis.set_xticks([x + width * (len(engines) - 1) / 2 for x in range(len(constraints))])
        axis.set_xticklabels(constraints, rotation=15, fontsize=8)
    axes[0].legend(fontsize=8)
    save_figure(figure, path)
