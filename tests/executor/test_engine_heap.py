"""The executor and the cyclic garbage collector (executor_service/heap.py): a finished request
leaves no reference cycle behind, whatever it asked for, so reference counting frees it and the
engine never waits on a full collection; the executor process freezes its startup heap and runs
full collections on its own clock."""
from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.engine.request import Request, Sequence
from executor_service.heap import NEVER, FullCollections
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint

# One of each kind of request the engine keeps extra links for: forked choices, beams (whose
# order lists their sequences), best_of samples ranked at the end, a seeded sampler.
KINDS = [
    SamplingParams(max_tokens=6, ignore_eos=True),
    SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True),
    SamplingParams(beam_width=2, n=2, temperature=0.0, max_tokens=6),
    SamplingParams(n=1, best_of=3, temperature=1.0, max_tokens=6, ignore_eos=True),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


def cyclic_garbage(run) -> list[object]:
    """The engine's objects that only the cyclic collector would free after `run()`."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # nothing is collected behind our back while the engine runs
    try:
        run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [obj for obj in gc.garbage if isinstance(obj, (Request, Sequence))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def test_finished_and_cancelled_requests_leave_no_reference_cycle(checkpoint):
    prompts = random_prompts([5, 9, 7, 12], seed=3)

    def run() -> None:
        # The engine goes with the function: what its buffers still held of the last
        # iteration's sequences must then be freed by reference counting too.
        engine = build_engine(checkpoint, EngineOptions(num_blocks=256, block_size=16),
                              LocalBlockAllocator())
        completions = generate(engine, prompts, KINDS)
        assert all(completion.error is None for completion in completions)
        assert [len(completion.choices) for completion in completions] == [1, 3, 2, 1]
        engine.add_request("cancelled", prompts[0], SamplingParams(n=2, max_tokens=50))
        engine.step()
        engine.step()
        engine.abort("cancelled")
        while engine.has_work():
            engine.step()
        assert not engine.requests

    assert cyclic_garbage(run) == []


def test_the_executor_freezes_its_startup_heap_and_stops_automatic_full_collections():
    # A process of its own: freezing is for the whole process, which is pytest's here.
    code = ("import gc\n"
            "import executor_service.engine.engine\n"
            "from executor_service.heap import settle_startup_heap\n"
            "settle_startup_heap()\n"
            "print(gc.get_freeze_count(), gc.get_threshold()[2])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert int(out[0]) > 50_000  # torch's and every other module's objects
    assert int(out[1]) == NEVER


def test_full_collections_run_when_due_and_only_then():
    full = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    collections = FullCollections(every_s=3600)
    gc.callbacks.append(count)
    try:
        collections.between_iterations()
        assert full == []
        collections.due_at = 0.0
        collections.between_iterations()
        assert full == [1]
        assert collections.due_at > 3000
    finally:
        gc.callbacks.remove(count)
