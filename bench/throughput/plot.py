"""docs/img/throughput_bench.png: output tokens/s of each contender, and what our engine put in
each iteration of its best run (decoding sequences, prompt tokens) and how long it took."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.plot import pyplot, save_figure
from bench.throughput.contenders import CONTINUOUS, OURS, STATIC
from bench.throughput.report import Results

COLORS = {OURS: "#4c72b0", STATIC: "#dd8452", CONTINUOUS: "#55a868"}
SHORT_LABELS = {OURS: "pagedserve\nengine", STATIC: "transformers\nstatic generate",
                CONTINUOUS: "transformers\ngenerate_batch"}


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()

    figure, (rates, batches) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=(2, 3))
    names = [OURS, STATIC, CONTINUOUS]
    best = [r.best(name).tokens_per_s for name in names]
    bars = rates.bar(range(3), best, color=[COLORS[name] for name in names])
    for position, name in enumerate(names):
        every = [run.tokens_per_s for run in r.rounds[name]]
        rates.plot([position] * len(every), every, "o", color="black", markersize=3)
    rates.bar_label(bars, labels=[f"{best[0]:,.0f}"] + [
        f"{rate:,.0f}\nours is {r.ratio(name):.2f}×" for rate, name in zip(best[1:], names[1:])],
        padding=2, fontsize=8)
    rates.set_xticks(range(3), [SHORT_LABELS[name] for name in names], fontsize=8)
    rates.set_ylim(0, max(best) * 1.25)
    rates.set_ylabel("output tokens/s (bar: best run, dots: every run)")
    rates.set_title(f"{len(r.workload.prompts)} requests, {r.workload.num_output_tokens:,} "
                    "output tokens")

    ours = r.best(OURS)
    steps = range(len(ours.batches))
    decoding = [decodes for decodes, _, _ in ours.batches]
    prompt = [tokens for _, tokens, _ in ours.batches]
    batches.bar(steps, decoding, width=1.0, color=COLORS[OURS],
                label="decoding sequences (one token each)")
    batches.bar(steps, prompt, width=1.0, bottom=decoding, color="#a6bddb",
                label="prompt tokens (chunked prefill)")
    batches.set_yscale("log")
    batches.set_xlabel("iteration of our engine (best run)")
    batches.set_ylabel("tokens in the forward pass (log scale)")
    batches.set_title(f"Our iterations: up to {r.settings.max_batched_tokens} tokens each")
    seconds = batches.twinx()
    seconds.plot(steps, [step_s * 1e3 for _, _, step_s in ours.batches], color="black",
                 linewidth=1.2, label="time of the iteration (right axis)")
    seconds.set_ylim(bottom=0)
    seconds.set_ylabel("ms per iteration")
    handles, labels = batches.get_legend_handles_labels()
    more_handles, more_labels = seconds.get_legend_handles_labels()
    batches.legend(handles + more_handles, labels + more_labels, fontsize=8, loc="upper right")

    figure.suptitle(f"pagedserve throughput, {report.today()}: {r.model}, "
                    f"{r.settings.dtype}, {r.device}", fontsize=10)
    save_figure(figure, path)
