"""What the grammar benchmark records and reports: per engine and constraint, the compile
times and per-token mask times of every round, the grid, the raw JSON and the
`## Structured output` section of docs/benchmarks.md. The plot is plot.py."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import report

JSON_NAME = "grammar_bench.json"
HEADING = "Structured output"
QUICK_NOTE = ("A validation run (--quick: a small vocabulary, one round), which proves the path "
              "end to end; not the measurement (`python -m bench.grammar`).")


@dataclass(slots=True)
class Measurement:
    engine: str
    constraint: str
    round: int
    # The engine's place in this round's order (the order alternates from round to round).
    position: int
    compile_s: float
    # Seconds per mask over the replayed tokens; empty when the engine refused one.
    mask_s: list[float] = field(default_factory=list)
    refused: str = ""


@dataclass(slots=True)
class Results:
    vocab_size: int
    rounds: int
    tokens: dict[str, int]           # constraint -> tokens replayed
    engines: dict[str, str]          # engine -> version
    measurements: list[Measurement] = field(default_factory=list)
    quick: bool = False

    def of(self, engine: str, constraint: str) -> list[Measurement]:
        return [m for m in self.measurements if m.engine == engine and m.constraint == constraint]

    def compile_ms(self, engine: str, constraint: str) -> float | None:
        runs = self.of(engine, constraint)
        return statistics.median(m.compile_s for m in runs) * 1e3 if runs else None

    def mask_us(self, engine: str, constraint: str) -> float | None:
        """Median over rounds of each round's mean per-token mask time; None if refused."""
        runs = [m for m in self.of(engine, constraint) if m.mask_s and not m.refused]
        if not runs:
            return None
        return statistics.median(statistics.fmean(m.mask_s) for m in runs) * 1e6

    def refusal(self, engine: str, constraint: str) -> str:
        return next((m.refused for m in self.of(engine, constraint) if m.refused), "")


def grid(results: Results) -> tuple[list[str], list[list[str]]]:
    header = ["constraint", "tokens"]
    for engine in results.engines:
        header += [f"{engine} compile (ms)", f"{engine} mask (µs/token)"]
    rows = []
    for constraint, tokens in results.tokens.items():
        row = [constraint, str(tokens)]
        for engine in results.engines:
            compile_ms = results.compile_ms(engine, constraint)
            mask = results.mask_us(engine, constraint)
            row.append("—" if compile_ms is None else f"{compile_ms:,.2f}")
            row.append("unsupported" if compile_ms is None else
                       "refused a token" if mask is None else f"{mask:,.1f}")
        rows.append(row)
    return header, rows


def section_body(results: Results, png: Path | None, md: Path) -> str:
    lines = report.section_preamble(HEADING)
    if results.quick:
        lines += [f"**{QUICK_NOTE}**", ""]
    lines += [report.list_item(f"tokenizer: byte-level BPE of {results.vocab_size:,} tokens "
                               "trained on Python's standard library (bench/grammar/"
                               "workloads.py)"),
              report.list_item("engines: " + ", ".join(f"{name} {version}" for name, version
                                                       in results.engines.items())),
              report.list_item(f"rounds: {results.rounds}, the engines' order alternating; "
                               "medians over rounds"), ""]
    header, rows = grid(results)
    lines += [report.markdown_grid(header, rows), ""]
    if png is not None:
        lines += [report.image_link(png, md, "grammar engine benchmark"), ""]
    return "\n".join(lines)


def write_json(results: Results, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / JSON_NAME
    path.write_text(json.dumps(asdict(results), indent=1))
    return path
