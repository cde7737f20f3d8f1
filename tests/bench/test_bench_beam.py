"""The beam benchmark's parts that need no vLLM: the block counts on a real engine, the
transformers contender on a small random checkpoint, and the `## Beam search` tables and plot
from fabricated results. The whole benchmark (`make bench-beam`) installs vLLM and is not a
test."""
from __future__ import annotations

from pathlib import Path

from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.beam import memory
from bench.beam import report as beam_report
from bench.beam.contenders import (CONTENDERS, HF_BATCHED, HF_SEQUENTIAL, PAGEDSERVE, VLLM,
                                   Transformers, Workload)
from bench.beam.plot import write_plot
from bench.beam.report import Blocks, Results, Run, Settings
from executor_service.engine.build import EngineOptions, build_engine
from tests.support.model_checkpoints import random_prompts, write_checkpoint


def test_blocks_are_counted_shared_and_unshared_over_the_same_beams(tmp_path: Path) -> None:
    directory = write_checkpoint("llama", tmp_path)
    engine = build_engine(directory, EngineOptions(num_blocks=256), LocalBlockAllocator())
    (prompt,) = random_prompts([70], seed=2)
    samples = memory.count_blocks(engine, "beams", prompt, width=4, max_tokens=20)
    counts = Blocks.from_samples(4, samples)
    # The prefill holds one sequence (nothing to share); then four beams share the prompt's
    # five blocks (70 tokens, block 16) and hold their own last blocks.
    shared, unshared = samples[0]
    assert shared == unshared
    assert all(s <= u for s, u in samples)
    assert counts.peak_unshared >= 4 * 5 and counts.peak_shared < counts.peak_unshared
    assert 0.4 < counts.saved < 0.8
    assert len(samples) == 20
    assert counts.mean_shared == sum(s for s, _ in samples) / 20
    assert engine.allocator.pool.sequences == {}


def test_transformers_contender_returns_every_hypothesis(tmp_path: Path) -> None:
    directory = write_checkpoint("llama", tmp_path)
    workload = Workload(random_prompts([12, 12], seed=3), width=3, max_tokens=5)
    hf = Transformers(directory)
    assert hf.batched(workload).output_tokens == workload.expected_tokens == 2 * 3 * 5
    assert hf.one_by_one(workload).output_tokens == 30


def fabricated() -> Results:
    settings = Settings(widths=(2, 4), num_requests=8, prompt_len=512, output_len=128,
                        rounds=2, memory_prompts=4, memory_block_size=16,
                        server={"block_size": 32, "kv_cache_gib": 1, "max_num_seqs": 256,
                                "max_num_batched_tokens": 2048, "dtype": "float32"})
    results = Results(settings, "0.32.0+cpu", {"embedded": "tiny (the embedded default)"},
                      blocks=[Blocks(2, 40.0, 80.0, 44, 84), Blocks(4, 45.0, 150.0, 50, 164)])
    speeds = {PAGEDSERVE: 1000.0, VLLM: 250.0, HF_BATCHED: 400.0, HF_SEQUENTIAL: 100.0}
    for round_index in range(2):
        for width in (2, 4):
            for position, contender in enumerate(CONTENDERS):
                tokens = 8 * width * 128
                speed = speeds[contender] * width * (1 + round_index)   # rounds differ
                results.runs.append(Run("embedded", width, contender, round_index, position,
                                        tokens / speed, tokens))
    return results


def test_tables_give_medians_over_rounds_ratios_and_targets() -> None:
    results = fabricated()
    assert results.tokens_per_s("embedded", 4, PAGEDSERVE) == 1000.0 * 4 * 1.5
    header, rows = beam_report.throughput_grid(results, "embedded")
    assert header[0] == "beam width" and header[-1] == "pagedserve / transformers, one by one"
    assert rows[1] == ["4", "6,000", "1,500", "2,400", "600", "4.00×", "2.50×", "10.00×"]
    _, block_rows = beam_report.blocks_grid(results)
    assert block_rows[1] == ["4", "45.0", "150.0", "70.0%", "50", "164", "69.5%"]
    targets = {row.metric: row for row in beam_report.target_rows(results)}
    saved = targets["KV blocks saved by sharing at width 4 (mean over the run)"]
    assert (saved.measured, saved.met) == ("70.0%", True)
    batched = targets["`embedded`: pagedserve / transformers, batched, output tok/s (widths 2, 4)"]
    assert (batched.measured, batched.met) == ("2.50×, 2.50×", False)
    assert targets["`embedded`: pagedserve / vLLM, output tok/s (widths 2, 4)"].met is True


def test_section_and_plot_from_fabricated_results(tmp_path: Path) -> None:
    results = fabricated()
    png, md = tmp_path / "img" / "beam.png", tmp_path / "benchmarks.md"
    write_plot(results, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    body = beam_report.section_body(results, png, md)
    assert ("Method and reading: [Beam search: how it is measured]"
            "(#beam-search-how-it-is-measured).") in body
    assert "### `embedded`: tiny (the embedded default)" in body
    assert "![beam search benchmark](img/beam.png)" in body
    assert "validation run" not in body
    results.quick = True
    assert "**A validation run (--quick" in beam_report.section_body(results, png, md)
    assert beam_report.write_json(results, tmp_path / "raw").exists()
