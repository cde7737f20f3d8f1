"""docs/img/kernels_bench.png: decode's achieved bandwidth against the copy bandwidth, the
paged/SDPA decode time by block size, and the paged/SDPA prefill time by prompt length."""
from __future__ import annotations

from pathlib import Path

from bench import report
from bench.kernels.config import TARGET_BANDWIDTH_FRACTION, TARGET_BLOCK_SIZE, TARGET_RATIO
from bench.kernels.report import Results
from bench.plot import pyplot, save_figure

LINE_STYLES = ("-", "--", ":", "-.")


def powers_of_two_axis(axes, ticks) -> None:
    """A log2 x axis labelled at exactly the swept values (sizes double from one to the next)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(list(ticks)))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))


def write_plot(r: Results, path: Path) -> None:
    plt = pyplot()

    s = r.shapes
    figure, (bandwidth, decode_ratio, prefill_ratio) = plt.subplots(1, 3, figsize=(17, 5.5))
    colors = plt.get_cmap("viridis")
    decode = r.measured_decode()

    def color(index: int, count: int) -> tuple:
        return colors(index / max(1, count - 1) * 0.9)

    for i, batch in enumerate(s.batches):
        points = sorted((d.context, d.gbs) for d in decode
                        if d.batch == batch and d.block_size == TARGET_BLOCK_SIZE)
        if points:
            bandwidth.plot(*zip(*points), "o-", color=color(i, len(s.batches)),
                           label=f"batch {batch}")
    bandwidth.axhline(r.copy_gbs, color="black", linestyle="--", linewidth=1.2,
                      label=f"copy bandwidth ({r.copy_gbs:,.0f} GB/s)")
    bandwidth.axhline(r.copy_gbs * TARGET_BANDWIDTH_FRACTION, color="grey", linestyle=":",
                      linewidth=1.2, label=f"{TARGET_BANDWIDTH_FRACTION:.0%} of it (target)")
    target = r.target_point()
    if target is not None:
        bandwidth.plot([target.context], [target.gbs], "*", color="crimson", markersize=14,
                       label=f"target point: batch {target.batch} × {target.context:,}")
    powers_of_two_axis(bandwidth, s.contexts)
    bandwidth.set_ylim(bottom=0)
    bandwidth.set_xlabel("context (tokens per sequence)")
    bandwidth.set_ylabel("achieved GB/s (K/V + queries + outputs / time)")
    bandwidth.set_title(f"Paged decode, block {TARGET_BLOCK_SIZE}: achieved bandwidth")
    bandwidth.legend(fontsize=8)

    for i, batch in enumerate(s.batches):
        points = sorted((d.block_size, d.ratio) for d in decode
                        if d.batch == batch and d.context == s.target_context)
        if points:
            decode_ratio.plot(*zip(*points), "o-", color=color(i, len(s.batches)),
                              linewidth=2.5 if batch == s.target_batch else 1.2,
                              label=f"batch {batch}")
    decode_ratio.axhline(TARGET_RATIO, color="black", linestyle="--", linewidth=1.2,
                         label=f"target ≤ {TARGET_RATIO}×")
    decode_ratio.axhline(1.0, color="lightgrey", linewidth=0.8)
    powers_of_two_axis(decode_ratio, s.block_sizes)
    decode_ratio.set_xlabel("block size (tokens)")
    decode_ratio.set_ylabel("paged time / SDPA time on contiguous K/V")
    decode_ratio.set_title(f"Decode at {s.target_context:,} context: paged / SDPA")
    decode_ratio.set_ylim(bottom=0)
    decode_ratio.legend(fontsize=8)

    prefill = [p for p in r.prefill if not p.skipped]
    for i, batch in enumerate(s.prefill_batches):
        for style, block_size in zip(LINE_STYLES, s.prefill_block_sizes):
            points = sorted((p.length, p.ratio) for p in prefill
                            if p.batch == batch and p.block_size == block_size)
            if points:
                prefill_ratio.plot(*zip(*points), "o", linestyle=style,
                                   color=color(i, len(s.prefill_batches)),
                                   label=f"batch {batch}, block {block_size}")
    prefill_ratio.axhline(1.0, color="lightgrey", linewidth=0.8)
    powers_of_two_axis(prefill_ratio, s.prefill_lengths)
    prefill_ratio.set_xlabel("prompt length (tokens, none cached)")
    prefill_ratio.set_ylabel("paged time / SDPA time (causal)")
    prefill_ratio.set_title("Causal prefill: paged / SDPA")
    prefill_ratio.set_ylim(bottom=0)
    prefill_ratio.legend(fontsize=8)

    note = " (CPU smoke run: timings meaningless)" if r.interpreted else ""
    figure.suptitle(f"pagedserve paged-attention kernels, {report.today()}: {r.device}, "
                    f"{r.dtype}, {s.num_q_heads} q heads / {s.num_kv_heads} kv heads / head dim "
                    f"{s.head_dim}; {r.versions}{note}", fontsize=10)
    save_figure(figure, path)
