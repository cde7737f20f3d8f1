"""docs/img/beam_bench.png: left, the KV blocks a request holds per beam width, shared and
unshared (labelled with the saving); then per workload, every contender's output tokens/s per
width (the median over the rounds; pagedserve's bar labelled with its ratio over vLLM)."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.beam.contenders import CONTENDERS, LABELS, PAGEDSERVE, VLLM
from bench.beam.report import Results
from bench.plot import pyplot, save_figure

COLORS = {PAGEDSERVE: "#dd8452", VLLM: "#4c72b0", "transformers-batched": "#55a868",
          "transformers-one-by-one": "#8fd19e"}


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()
    panels = 1 + len(r.workloads)
    figure, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.6))
    blocks = axes[0]
    widths = [b.width for b in r.blocks]
    xs = range(len(widths))
    blocks.bar([x - 0.2 for x in xs], [b.mean_unshared for b in r.blocks], 0.4,
               color="#999999", label="unshared (a copy per beam)")
    bars = blocks.bar([x + 0.2 for x in xs], [b.mean_shared for b in r.blocks], 0.4,
                      color=COLORS[PAGEDSERVE], label="shared (copy-on-write)")
    blocks.bar_label(bars, labels=[f"−{b.saved:.0%}" for b in r.blocks], padding=2, fontsize=8)
    blocks.set_xticks(list(xs), [f"k={w}" for w in widths])
    blocks.set_ylabel("KV blocks held per request (mean over its iterations)")
    blocks.set_title("memory (lower is better)")
    blocks.legend(fontsize=8, loc="upper left")
    bar = 0.8 / len(CONTENDERS)
    for panel, workload in zip(axes[1:], r.workloads):
        positions = range(len(r.settings.widths))
        for offset, name in enumerate(CONTENDERS):
            xs = [x + (offset - (len(CONTENDERS) - 1) / 2) * bar for x in positions]
            values = [r.tokens_per_s(workload, width, name) for width in r.settings.widths]
            bars = panel.bar(xs, values, bar, color=COLORS[name], label=LABELS[name])
            if name == PAGEDSERVE:
                panel.bar_label(bars, labels=[f"{r.ratio(workload, w, VLLM):.1f}×"
                                              for w in r.settings.widths],
                                padding=2, fontsize=8)
        panel.set_xticks(list(positions), [f"k={w}" for w in r.settings.widths])
        panel.set_ylabel("output tokens/s (label: pagedserve over vLLM)")
        panel.set_title(f"{workload}: throughput (higher is better)")
        panel.legend(fontsize=7, loc="upper right")
        top = max(r.tokens_per_s(workload, w, c) for w in r.settings.widths for c in CONTENDERS)
        panel.set_ylim(0, top * 1.3)
    s = r.settings
    figure.suptitle(f"beam search, {report.today()}: {s.num_requests} requests × "
                    f"{s.prompt_len} in / {s.output_len} out per hypothesis, median of "
                    f"{s.rounds} round(s)", fontsize=10)
    save_figure(figure, path)
