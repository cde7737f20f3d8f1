"""docs/img/serve_bench.png: output tokens/s of each contender at each request rate, and their
TTFT and ITL (median bars, p99 dots) from the best runs."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.plot import pyplot, save_figure
from bench.serve.metrics import summary_ms
from bench.serve.report import CONTENDERS, ENGINE, GRPC, HTTP, LABELS, Results
from bench.serve.workload import rate_label

COLORS = {ENGINE: "#4c72b0", GRPC: "#dd8452", HTTP: "#55a868"}
WIDTH = 0.26


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()

    rates = r.settings.request_rates
    figure, (throughput, ttft, itl) = plt.subplots(1, 3, figsize=(16, 5))
    positions = range(len(rates))
    for offset, name in enumerate(CONTENDERS):
        xs = [x + (offset - 1) * WIDTH for x in positions]
        best = [r.best(name, rate) for rate in rates]
        bars = throughput.bar(xs, [run.tokens_per_s for run in best], WIDTH,
                              color=COLORS[name], label=LABELS[name])
        throughput.bar_label(bars, labels=[
            f"{run.tokens_per_s:,.0f}" if name == ENGINE
            else f"{run.tokens_per_s:,.0f}\n{r.ratio(name, rate):.2f}×"
            for run, rate in zip(best, rates)], padding=2, fontsize=7)
        for axes, samples_of in ((ttft, lambda run: run.ttfts_s()),
                                 (itl, lambda run: run.itls_s())):
            summaries = [summary_ms(samples_of(run)) for run in best]
            axes.bar(xs, [s["median"] for s in summaries], WIDTH, color=COLORS[name],
                     label=f"{LABELS[name]}: median")
            axes.plot(xs, [s["p99"] for s in summaries], "o", color=COLORS[name],
                      markeredgecolor="black", markersize=5)
    labels = [f"rate {rate_label(rate)} req/s" for rate in rates]
    throughput.set_ylabel("output tokens/s (best run; label: over in-process)")
    throughput.set_title(f"{len(r.workload.prompts)} requests, at most "
                         f"{r.settings.max_concurrency} open")
    throughput.legend(fontsize=8, loc="upper right")
    for axes, what in ((ttft, "time to first token"), (itl, "inter-token latency")):
        axes.set_yscale("log")
        axes.set_ylabel(f"{what}, ms (bar: median, dot: p99; log scale)")
        axes.set_title(what)
    for axes in (throughput, ttft, itl):
        axes.set_xticks(list(positions), labels, fontsize=8)
    throughput.set_ylim(0, max(run.tokens_per_s for run in r.runs) * 1.45)
    figure.suptitle(f"pagedserve serving, {report.today()}: {r.model}, {r.settings.dtype}, "
                    f"{r.device}: the whole stack against the in-process engine", fontsize=10)
    save_figure(figure, path)
