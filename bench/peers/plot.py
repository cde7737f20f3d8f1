"""docs/img/peers_bench.png: per workload, both contenders' output tokens/s (labelled with
pagedserve / vLLM) and their TPOT (median bars, p99 dots), each the median over the rounds."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.peers.report import LABELS, Results
from bench.peers.stacks import CONTENDERS, PAGEDSERVE, VLLM
from bench.plot import pyplot, save_figure

COLORS = {PAGEDSERVE: "#dd8452", VLLM: "#4c72b0"}
WIDTH = 0.36


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()
    figure, (throughput, tpot) = plt.subplots(1, 2, figsize=(11, 4.6))
    positions = range(len(r.workloads))
    for offset, name in enumerate(CONTENDERS):
        xs = [x + (offset - 0.5) * WIDTH for x in positions]
        tokens = [w.median(name, lambda res: res.output_throughput) for w in r.workloads]
        bars = throughput.bar(xs, tokens, WIDTH, color=COLORS[name], label=LABELS[name])
        labels = [f"{value:,.0f}" for value in tokens]
        if name == PAGEDSERVE:
            theirs = [w.median(VLLM, lambda res: res.output_throughput) for w in r.workloads]
            labels = [f"{value:,.0f}\n{value / other:.2f}×"
                      for value, other in zip(tokens, theirs)]
        throughput.bar_label(bars, labels=labels, padding=2, fontsize=8)
        medians = [w.median(name, lambda res: res.latency_ms["tpot"]["median"])
                   for w in r.workloads]
        p99s = [w.median(name, lambda res: res.latency_ms["tpot"]["p99"]) for w in r.workloads]
        tpot.bar(xs, medians, WIDTH, color=COLORS[name], label=f"{LABELS[name]}: median")
        tpot.plot(xs, p99s, "o", color=COLORS[name], markeredgecolor="black", markersize=5,
                  label=f"{LABELS[name]}: p99")
    names = [w.name for w in r.workloads]
    for axes in (throughput, tpot):
        axes.set_xticks(list(positions), names)
        axes.legend(fontsize=8, loc="upper right")
    throughput.set_ylabel("output tokens/s (label on pagedserve: over vLLM)")
    throughput.set_ylim(0, max(w.median(name, lambda res: res.output_throughput)
                               for w in r.workloads for name in CONTENDERS) * 1.35)
    throughput.set_title("throughput (higher is better)")
    tpot.set_ylabel("time per output token, ms (bar: median, dot: p99)")
    tpot.set_title("TPOT (lower is better)")
    tpot.set_ylim(0, max(w.median(name, lambda res: res.latency_ms["tpot"]["p99"])
                         for w in r.workloads for name in CONTENDERS) * 1.45)
    c = r.client
    figure.suptitle(f"pagedserve vs vLLM {r.vllm_version} (CPU), {report.today()}: "
                    f"{c.num_prompts} prompts × {c.input_len} in / {c.output_len} out, at most "
                    f"{c.max_concurrency} open, median of {r.rounds} round(s)", fontsize=10)
    save_figure(figure, path)
