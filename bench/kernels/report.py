"""What the kernels benchmark records and reports: one result per timed combination, the tables
(terminal and markdown), the target rows, the raw JSON, and its `## Kernels` section of
docs/benchmarks.md. The plot is plot.py; the measuring, measure.py; how it measures and how to read
it is written once, by hand, in docs/benchmarks.md (`## Kernels: how it is measured`)."""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import report
from bench.kernels.config import TARGET_BANDWIDTH_FRACTION, TARGET_BLOCK_SIZE, TARGET_RATIO, Shapes

NAN = float("nan")


@dataclass(slots=True)
class DecodeResult:
    block_size: int
    context: int
    batch: int
    kv_bytes: int                  # K and V of every sequence's context, as the kernel reads it
    skipped: bool = False          # over --max-kv-gib: never allocated
    paged_us: float = NAN
    sdpa_us: float = NAN           # same (context, batch) for every block size: timed once
    sdpa_backend: str = ""         # the fastest that took the shapes (measure.py)
    bytes_moved: int = 0           # K/V read + queries read + outputs written
    max_abs_error: float = NAN     # paged output against SDPA's, same data
    close: bool = True

    @property
    def gbs(self) -> float:
        return self.bytes_moved / (self.paged_us * 1e-6) / 1e9

    @property
    def ratio(self) -> float:
        return self.paged_us / self.sdpa_us


@dataclass(slots=True)
class PrefillResult:
    block_size: int
    batch: int
    length: int                    # prompt tokens per sequence, none of them cached before
    kv_bytes: int
    skipped: bool = False
    paged_us: float = NAN
    sdpa_us: float = NAN
    sdpa_backend: str = ""
    flops: float = 0.0             # causal attention: QKᵀ and PV over the lower triangle
    max_abs_error: float = NAN
    close: bool = True

    @property
    def ratio(self) -> float:
        return self.paged_us / self.sdpa_us

    def tflops(self, us: float) -> float:
        return self.flops / (us * 1e-6) / 1e12


@dataclass(slots=True)
class Results:
    shapes: Shapes
    device: str
    dtype: str
    versions: str                  # torch, triton, CUDA
    max_kv_gib: float
    interpreted: bool              # CPU smoke run: the timings mean nothing
    copy_gbs: float = NAN
    decode: list[DecodeResult] = field(default_factory=list)
    prefill: list[PrefillResult] = field(default_factory=list)

    def measured_decode(self) -> list[DecodeResult]:
        return [d for d in self.decode if not d.skipped]

    def target_point(self) -> DecodeResult | None:
        s = self.shapes
        return next((d for d in self.measured_decode() if d.block_size == TARGET_BLOCK_SIZE
                     and d.batch == s.target_batch and d.context == s.target_context), None)

    def mismatches(self) -> list[DecodeResult | PrefillResult]:
        return [r for r in [*self.decode, *self.prefill] if not r.skipped and not r.close]


def gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB" if size >= 1024**3 else f"{size / 1024**2:.1f} MiB"


def rate(value: float) -> str:
    """Whole units where that reads well; three significant digits for the tiny rates of the
    CPU smoke run, which would otherwise all print as 0."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def decode_grid(r: Results, rows: list[DecodeResult]) -> tuple[list[str], list[list[str]]]:
    header = ["block", "context", "batch", "K+V", "paged µs", "SDPA µs", "paged/SDPA",
              "achieved GB/s", "% of copy", "max abs diff vs SDPA"]
    cells = []
    for d in rows:
        cells.append([str(d.block_size), f"{d.context:,}", str(d.batch), gib(d.kv_bytes)] + (
            [f"skipped: over --max-kv-gib {r.max_kv_gib:.3g}"] + [""] * 5 if d.skipped else
            [f"{d.paged_us:,.1f}", f"{d.sdpa_us:,.1f} ({d.sdpa_backend})", f"{d.ratio:.2f}×",
             rate(d.gbs), f"{d.gbs / r.copy_gbs:.0%}",
             f"{d.max_abs_error:.1e}" + ("" if d.close else " MISMATCH")]))
    return header, cells


def prefill_grid(r: Results) -> tuple[list[str], list[list[str]]]:
    header = ["block", "batch", "prompt", "K+V", "paged ms", "SDPA ms", "paged/SDPA",
              "paged TFLOP/s", "SDPA TFLOP/s", "max abs diff vs SDPA"]
    cells = []
    for p in r.prefill:
        cells.append([str(p.block_size), str(p.batch), f"{p.length:,}", gib(p.kv_bytes)] + (
            [f"skipped: over --max-kv-gib {r.max_kv_gib:.3g}"] + [""] * 5 if p.skipped else
            [f"{p.paged_us / 1e3:,.3f}", f"{p.sdpa_us / 1e3:,.3f} ({p.sdpa_backend})",
             f"{p.ratio:.2f}×", rate(p.tflops(p.paged_us)), rate(p.tflops(p.sdpa_us)),
             f"{p.max_abs_error:.1e}" + ("" if p.close else " MISMATCH")]))
    return header, cells


def target_rows(r: Results) -> list[report.Row]:
    """The two targets the issue sets; the second is judged over every measured block size."""
    Row = report.Row
    s = r.shapes
    label = (f"decode bandwidth at batch {s.target_batch} × {s.target_context:,} context, block "
             f"{TARGET_BLOCK_SIZE} (% of copy bandwidth)")
    target = r.target_point()
    if target is None:
        rows = [Row(label, "not measured", f"≥ {TARGET_BANDWIDTH_FRACTION:.0%}", False)]
    else:
        fraction = target.gbs / r.copy_gbs
        rows = [Row(label, f"{rate(target.gbs)} GB/s = {fraction:.0%}",
                    f"≥ {TARGET_BANDWIDTH_FRACTION:.0%}", fraction >= TARGET_BANDWIDTH_FRACTION)]
    label = f"worst paged/SDPA decode time ratio, block ≥ {TARGET_BLOCK_SIZE}"
    decode = [d for d in r.measured_decode() if d.block_size >= TARGET_BLOCK_SIZE]
    if not decode:
        return rows + [Row(label, "not measured", f"≤ {TARGET_RATIO}×", False)]
    worst = max(decode, key=lambda d: d.ratio)
    median = statistics.median(d.ratio for d in decode)
    measured = (f"{worst.ratio:.2f}× at block {worst.block_size}, batch {worst.batch} × "
                f"{worst.context:,}; median {median:.2f}× over {len(decode)}")
    return rows + [Row(label, measured, f"≤ {TARGET_RATIO}×", worst.ratio <= TARGET_RATIO)]


def result_rows(r: Results) -> list[report.Row]:
    Row = report.Row
    rows = [Row("device copy bandwidth, `dst.copy_(src)` of "
                f"{gib(r.shapes.copy_bytes)} (read + write, GB/s)", rate(r.copy_gbs)),
            *target_rows(r)]
    prefill = [p for p in r.prefill if not p.skipped]
    if prefill:
        ratios = [p.ratio for p in prefill]
        rows.append(Row("paged/SDPA causal prefill time ratio, median (best, worst)",
                        f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}×, "
                        f"{max(ratios):.2f}×)"))
    checked = [x for x in [*r.decode, *r.prefill] if not x.skipped]
    rows.append(Row("paged outputs matching SDPA on the same K/V (sanity check)",
                    f"{len(checked) - len(r.mismatches())} of {len(checked)}",
                    f"all {len(checked)}", not r.mismatches()))
    return rows


def target_lines(r: Results) -> list[str]:
    return [f"{row.metric}: {row.measured} (target {row.target}): "
            f"{'met' if row.met else 'NOT met'}" for row in target_rows(r)]


def settings_lines(r: Results) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    s = r.shapes
    timing = ("the median of `triton.testing.do_bench_cudagraph` (`do_bench` for a call that "
              "cannot be captured)" if not r.interpreted else "single wall-clock calls")
    return [
        f"Shapes ({s.label}): {s.num_q_heads} query heads, {s.num_kv_heads} kv heads, head "
        f"dim {s.head_dim}, {r.dtype}.",
        f"Copy bandwidth: `dst.copy_(src)` of {gib(s.copy_bytes)}.",
        f"Times: {timing}.",
        f"Skipped: combinations whose K+V exceed `--max-kv-gib {r.max_kv_gib:.3g}`.",
    ]


def section_body(r: Results, png: Path | None, md: Path) -> str:
    s = r.shapes
    machine = f"Measured {report.today()} on {r.device}, {r.versions}."
    if r.interpreted:
        machine += (" CPU smoke run (--quick) under the Triton interpreter: the timings say "
                    "nothing about the kernels.")
    at_target = [d for d in r.decode if d.batch == s.target_batch
                 and d.context == s.target_context]
    block_16 = [d for d in r.decode if d.block_size == TARGET_BLOCK_SIZE]
    lines = [
        *report.section_preamble("Kernels", machine),
        *(report.list_item(line) for line in settings_lines(r)), "",
        *(f"- **{line}**" for line in target_lines(r)), "",
        report.markdown_table(result_rows(r)), "",
        f"Decode at batch {s.target_batch} × {s.target_context:,} context, every block size:", "",
        report.markdown_grid(*decode_grid(r, at_target)), "",
        f"Decode at block size {TARGET_BLOCK_SIZE}, every context and batch:", "",
        report.markdown_grid(*decode_grid(r, block_16)), "",
        "<details><summary>Decode, every combination</summary>", "",
        report.markdown_grid(*decode_grid(r, r.decode)), "",
        "</details>", "",
        "Prefill (causal, fresh prompts):", "",
        report.markdown_grid(*prefill_grid(r)),
    ]
    if png is not None:
        lines += ["", report.image_link(png, md, "kernels benchmark")]
    return "\n".join(lines)


def write_json(r: Results, directory: Path) -> Path:
    """The raw numbers, plus the derived ones, for scripts that gather several benchmarks."""
    def finite(value: float) -> float | None:
        return value if math.isfinite(value) else None

    data = {
        "device": r.device, "dtype": r.dtype, "versions": r.versions,
        "interpreted": r.interpreted, "max_kv_gib": r.max_kv_gib, "copy_gbs": r.copy_gbs,
        "shapes": asdict(r.shapes),
        "decode": [asdict(d) | ({} if d.skipped else {"achieved_gbs": d.gbs,
                                                      "paged_over_sdpa": d.ratio})
                   for d in r.decode],
        "prefill": [asdict(p) | ({} if p.skipped else {
            "paged_tflops": p.tflops(p.paged_us), "sdpa_tflops": p.tflops(p.sdpa_us),
            "paged_over_sdpa": p.ratio}) for p in r.prefill],
        "targets": [asdict(row) for row in result_rows(r)],
    }
    for row in [*data["decode"], *data["prefill"]]:
        for key, value in row.items():
            if isinstance(value, float):
                row[key] = finite(value)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "kernels_bench.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
