"""What every benchmark under bench/ reports the same way: timings, the machine, docs/benchmarks.md.

Benchmarks print a table and replace only their own `## Name` section of docs/benchmarks.md, so
several benchmarks share the page and each rewrites just what it measured; hand-written sections
under other headings stay. Also why an engine benchmark refuses a device (`refused`).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import re
import statistics
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
PAGE_HEADER = """# Benchmarks

Results written by the benchmarks under `bench/` (`python -m bench.<family>` from the repository
root), one section per benchmark; rerun a benchmark to replace its section. A section named
`<benchmark>: how it is measured` is written by hand and no run touches it. Timings come from noisy
shared machines, so each benchmark measures the things it compares side by side in one run and
states the comparison as a ratio.
"""


@dataclass(slots=True, frozen=True)
class Row:
    metric: str
    measured: str
    target: str = ""
    # None: informational, no target.
    met: bool | None = None


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted samples."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / mean of timings given in seconds, in milliseconds."""
    return {"p50": percentile(samples_s, 50) * 1e3, "p99": percentile(samples_s, 99) * 1e3,
            "mean": statistics.fmean(samples_s) * 1e3}


def drawn_lengths(lengths: Sequence[int]) -> str:
    """What a workload actually drew, for its description: median, mean, p90 and max."""
    return (f"median {statistics.median(lengths):.0f}, mean {statistics.fmean(lengths):.0f}, "
            f"p90 {percentile(lengths, 90)}, max {max(lengths)}")


def machine_description() -> str:
    import grpc  # only the benchmarks that talk gRPC reach this module with grpc installed

    return (f"{os.cpu_count()} CPU cores ({cpu_model()}, {platform.system()}), "
            f"Python {platform.python_version()}, grpcio {grpc.__version__}")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_line() -> str:
    """How this run was started, as it would be typed at the repository root."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name.endswith(".__main__"):
        started = ["-m", spec.name.removesuffix(".__main__")]
    elif spec is not None:
        started = ["-m", spec.name]
    else:
        started = sys.argv[:1]
    return " ".join([".venv/bin/python", *started, *sys.argv[1:]])


def text_table(rows: Sequence[Row]) -> str:
    """The rows as aligned plain text, for the terminal."""
    cells = [("metric", "measured", "target", "met?")] + [
        (row.metric, row.measured, row.target or "-", _met(row.met)) for row in rows]
    widths = [max(len(cell[i]) for cell in cells) for i in range(4)]
    lines = ["  ".join(cell[i].ljust(widths[i]) for i in range(4)).rstrip() for cell in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| metric | measured | target | met? |", "|---|---:|---:|:---:|"]
    lines += [f"| {row.metric} | {row.measured} | {row.target or '—'} | {_met(row.met)} |"
              for row in rows]
    return "\n".join(lines)


def text_grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Any table as aligned plain text, for the terminal (first column left, the rest right)."""
    cells = [list(header)] + [list(row) for row in rows]
    widths = [max(len(cell[i]) for cell in cells) for i in range(len(header))]

    def line(cell: list[str]) -> str:
        return "  ".join(text.ljust(width) if i == 0 else text.rjust(width)
                         for i, (text, width) in enumerate(zip(cell, widths))).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * width for width in widths)]
                     + [line(cell) for cell in cells[1:]])


def markdown_grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Any table as markdown (first column left-aligned, the rest right-aligned)."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def list_item(line: str) -> str:
    """A markdown list item, wrapped at 100 columns: how a section states a setting or a
    per-run figure (what it means is in the hand-written method section)."""
    return textwrap.fill(line, 100, initial_indent="- ", subsequent_indent="  ",
                         break_on_hyphens=False)


def method_link(name: str) -> str:
    """The line that points a generated section to its hand-written `## <name>: how it is
    measured` section on the same page."""
    heading = f"{name}: how it is measured"
    anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    return f"Method and reading: [{heading}](#{anchor})."


def section_preamble(name: str, machine: str = "") -> list[str]:
    """The lines a generated section opens with: when and where it was measured (`machine`, or
    today on this machine), the command that wrote it, and the link to its method section."""
    machine = machine or f"Measured {today()} on {machine_description()}."
    return [textwrap.fill(machine, 100), "", f"Command: `{command_line()}`", "",
            method_link(name), ""]


def replace_section(page: Path, heading: str, body: str) -> None:
    """Writes `## heading` + body into the page, replacing that section up to the next `## `.

    Creates the page (with a short header) when missing; other sections stay as they are.
    """
    text = page.read_text() if page.exists() else PAGE_HEADER
    section = f"## {heading}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(heading)}[ \t]*\n.*?(?=^## |\Z)", re.M | re.S)
    match = pattern.search(text)
    if match:
        following = text[match.end():]
        text = text[:match.start()] + section + ("\n" if following else "") + following
    else:
        text = text.rstrip("\n") + "\n\n" + section
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)


def image_link(png: Path, md: Path, alt: str) -> str:
    """Markdown that shows `png` on the page `md`, by a path relative to the page."""
    relative = Path(os.path.relpath(png.resolve(), md.resolve().parent))
    return f"![{alt}]({relative.as_posix()})"


def today() -> str:
    return datetime.date.today().isoformat()


def _met(met: bool | None) -> str:
    return "—" if met is None else ("yes" if met else "NO")


def publish(heading: str, results: object, report: Any, write_plot: Callable[[Any, Path], None],
            results_dir: Path | None, out_png: Path | None, out_md: Path | None) -> None:
    """Writes what was asked for and says where: the raw JSON (`report.write_json`), the plot,
    and the page's `## heading` section (`report.section_body`)."""
    if results_dir is not None:
        print(f"raw results: {report.write_json(results, results_dir)}")
    if out_png is not None:
        write_plot(results, out_png)
        print(f"plot: {out_png}")
    if out_md is not None:
        replace_section(out_md, heading, report.section_body(results, out_png, out_md))
        print(f"results: {out_md} (## {heading})")


def with_overrides(preset: T, **values: object) -> T:
    """The preset (a dataclass) with the values given on the command line; None keeps the
    preset's."""
    return dataclasses.replace(preset, **{k: v for k, v in values.items() if v is not None})


def add_output_flags(parser: argparse.ArgumentParser, page: str = "benchmarks.md") -> None:
    """--quick, --out-md and --out-png, alike for every benchmark; `page` is the default page
    under docs/ whose section the benchmark rewrites."""
    parser.add_argument("--quick", action="store_true",
                        help="tiny smoke run; writes the doc and plot only when given explicitly")
    parser.add_argument("--out-md", type=Path, default=None,
                        help="markdown page whose section is replaced "
                             f"(default docs/{page}; none with --quick)")
    parser.add_argument("--out-png", type=Path, default=None,
                        help="plot (default docs/img/<benchmark>.png; none with --quick)")


def output_paths(args: argparse.Namespace, png_name: str, page: str = "benchmarks.md"
                 ) -> tuple[Path | None, Path | None]:
    """Where to write the doc section and the plot: the defaults unless --quick or given."""
    out_md = args.out_md or (None if args.quick else ROOT / "docs" / page)
    out_png = args.out_png or (None if args.quick else ROOT / "docs" / "img" / png_name)
    return out_md, out_png



def refusal(device: str) -> str | None:
    """Why this machine cannot run an engine benchmark on `device`, or None: our Triton kernels
    must not be timed interpreted."""
    if not device.startswith("cuda"):
        return None
    import torch

    from kernels.triton_support import interpreting

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if interpreting():
        return "TRITON_INTERPRET is set, so the engine's Triton kernels would be interpreted"
    return None


def refused(script: str, device: str) -> bool:
    """True, having said why on stderr, when `script` cannot honestly run on `device` here."""
    why = refusal(device)
    if why is not None:
        print(f"{script} was asked for {device}, and {why}. Nothing was written.",
              file=sys.stderr)
    return why is not None
