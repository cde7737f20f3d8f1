"""The grammar-engine benchmark's quick run end to end (every installed engine, a small
vocabulary), and its section and plot from the results."""
from __future__ import annotations

from pathlib import Path

from bench.grammar import report as grammar_report
from bench.grammar.__main__ import QUICK, run
from bench.grammar.engines import LLGUIDANCE
from bench.grammar.plot import write_plot


def test_quick_run_measures_every_engine_and_writes_its_section(tmp_path: Path) -> None:
    results = run(QUICK, quick=True)
    assert LLGUIDANCE in results.engines
    for constraint in results.tokens:
        # llguidance drew every sequence, so it replays all of them.
        assert results.compile_ms(LLGUIDANCE, constraint) > 0
        assert results.mask_us(LLGUIDANCE, constraint) > 0
    png, md = tmp_path / "img" / "grammar.png", tmp_path / "benchmarks.md"
    write_plot(results, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    body = grammar_report.section_body(results, png, md)
    assert "**A validation run (--quick" in body and "![grammar engine benchmark]" in body
    assert grammar_report.write_json(results, tmp_path / "raw").exists()
