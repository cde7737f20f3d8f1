"""`python -m bench.memory`: its --quick mode runs (so it can never rot), the reservation
replay counts exactly, and the stand-in forward pass of its paged runs changes nothing a real
model would. No timings are asserted: the machine is shared and noisy."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.memory.paged import MAX_NUM_SEQS, replay_paged, stand_in_engine
from bench.memory.reservation import (max_length_reservation, power_of_two_reservation,
                                      replay_reservations)
from bench.memory.samples import Sample
from bench.memory.workload import QUICK, draw_workload
from executor_service.engine.build import EngineOptions, build_engine
from tests.support.bench_runs import BENCH_ENV
from tests.support.model_checkpoints import write_checkpoint

ROOT = Path(__file__).resolve().parents[2]


METRICS = ("allocated KV slots holding tokens while requests wait, paged block 16",
           "mean concurrent sequences while requests wait, paged block 16 / contiguous "
           "max-length reservation",
           "requests that completed with all their tokens (sanity check)",
           "paged samples equal to the admin API's `pool_stats` (sanity check)")


def run_quick(cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.memory", "--quick", *flags], cwd=cwd,
                          env=BENCH_ENV, capture_output=True, text=True, timeout=120)


def test_memory_bench_quick_run_prints_its_tables_and_writes_nothing_by_default(
        tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = run_quick(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for metric in METRICS:
        assert metric in run.stdout
    for scheme in ("contiguous, max-length reservation", "contiguous, power-of-two reservation",
                   "pagedserve, block 16", "pagedserve, block 64"):
        assert scheme in run.stdout
    for sanity in METRICS[2:]:
        line = next(line for line in run.stdout.splitlines() if line.startswith(sanity))
        assert line.split()[-1] == "yes", line
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []


def test_memory_bench_quick_run_writes_its_section_plot_and_raw_results_when_told(
        tmp_path: Path) -> None:
    run = run_quick(tmp_path, "--out-md", "out/bench.md", "--out-png", "out/memory.png",
                    "--results-dir", "raw")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    page = (tmp_path / "out" / "bench.md").read_text()
    assert "\n## Memory\n" in page
    assert "![memory benchmark](memory.png)" in page
    for metric in METRICS:
        assert metric in page
    assert (tmp_path / "out" / "memory.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    raw = json.loads((tmp_path / "raw" / "memory_bench.json").read_text())
    assert [scheme["name"] for scheme in raw["schemes"]] == ["contiguous", "pow2", "paged-16",
                                                             "paged-64"]
    assert all(scheme["completed"] == QUICK.num_requests for scheme in raw["schemes"])


def test_power_of_two_reservation_rounds_prompt_plus_output_up() -> None:
    assert [power_of_two_reservation(p, o) for p, o in
            [(1, 1), (3, 2), (4, 4), (5, 4), (161, 338), (1024, 1024)]] == \
        [2, 8, 8, 16, 512, 2048]


# Three requests (prompt, output): (3, 2), (2, 3), (4, 1), each reserving 8 slots of 16.
PROMPTS, OUTPUTS = [3, 2, 4], [2, 3, 1]


def test_reservation_replay_admits_what_fits_and_releases_after_the_last_token() -> None:
    run = replay_reservations("contiguous", "", PROMPTS, OUTPUTS, max_length_reservation(8),
                              budget_slots=16, max_batched_tokens=100)
    # 1: both first requests admitted, prompts computed (3 + 2 tokens held), the third waits.
    # 2: each decodes one token; the first has sampled its 2 and gives its 8 slots back.
    # 3: the second decodes its last; the third is admitted, and its one token ends it.
    assert run.samples == [Sample(True, 2, 5, 16), Sample(True, 2, 7, 16),
                           Sample(False, 2, 8, 16)]
    assert run.completed == 3 and run.preemptions == 0
    assert run.slot_share() == 12 / 32
    assert run.mean_sequences() == 2 and run.max_sequences() == 2


def test_reservation_replay_chunks_prompts_to_the_token_budget() -> None:
    run = replay_reservations("pow2", "", PROMPTS, OUTPUTS, power_of_two_reservation,
                              budget_slots=16, max_batched_tokens=4)
    # 1: the first prompt (3) and 1 of the second's 2 tokens; a prompt is held whole once in.
    # 2: the first decodes its last; the second finishes its prompt.
    # 3: the second decodes; the third is admitted with 3 of its 4 prompt tokens (budget 4).
    # 4: both finish.
    assert run.samples == [Sample(True, 2, 5, 16), Sample(True, 2, 6, 16),
                           Sample(False, 2, 7, 16), Sample(False, 2, 8, 16)]
    assert run.completed == 3


def test_stand_in_forward_pass_gives_the_samples_of_a_real_model(tmp_path: Path) -> None:
    """Where memory goes does not depend on the tokens a model computes: the paged runs' stand-in
    must sample the pool exactly as an engine built on a real checkpoint does."""
    # The quick preset, smaller still (a real CPU forward pass is the slow part): 30 requests
    # in 32 blocks of 16, which is tight enough to preempt.
    settings = dataclasses.replace(QUICK, num_requests=30, budget_slots=512)
    workload = draw_workload(settings)
    checkpoint = write_checkpoint("llama", tmp_path / "llama", vocab_size=settings.vocab_size)
    block_size = 16
    real = build_engine(checkpoint, EngineOptions(
        dtype="float32", block_size=block_size, num_blocks=settings.budget_slots // block_size,
        max_model_len=settings.max_model_len, max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=settings.max_batched_tokens,
        lookahead_slots=settings.lookahead_slots), LocalBlockAllocator())
    real_run = replay_paged(real, workload)
    stand_in_run = replay_paged(stand_in_engine(settings, block_size), workload)
    assert real_run.preemptions > 0 and real_run.num_saturated > 0
    assert real_run.completed == stand_in_run.completed == settings.num_requests
    assert (real_run.samples, real_run.preemptions) == \
        (stand_in_run.samples, stand_in_run.preemptions)


@pytest.mark.parametrize("block_size", QUICK.block_sizes)
def test_paged_quick_run_never_allocates_past_its_budget(block_size: int) -> None:
    run = replay_paged(stand_in_engine(QUICK, block_size), draw_workload(QUICK))
    assert run.num_saturated > 0
    assert all(0 < sample.tokens <= sample.slots <= QUICK.budget_slots
               for sample in run.samples)
    assert run.checked > 0 and run.agreed == run.checked
