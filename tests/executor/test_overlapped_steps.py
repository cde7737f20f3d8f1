"""When an engine waits for its Step's answer. A Step the forward pass depends on (an
admission) is read before the pass; any other stays in flight through the pass and the
sampling, and is mirrored once the iteration's tokens are recorded, unless a beam search
samples (its decision forks beams from what the Step records). Nothing sends a second Step
while one is in flight."""
from __future__ import annotations

from pathlib import Path

import pytest

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint

BLOCK = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


class Timeline:
    """What an engine does, in order: "submit", "answer" (a Step's result read), "pass" and
    "sample"; and how many Steps were in flight at most."""

    def __init__(self, engine) -> None:
        self.events: list[str] = []
        self.in_flight = self.most_in_flight = 0
        submit, execute, sample = engine.allocator.submit, engine.runner.execute, \
            engine.sampler.sample
        timeline = self

        class Handle:
            def __init__(self, handle) -> None:
                self.handle, self.read = handle, False

            def result(self):
                if not self.read:
                    self.read = True
                    timeline.in_flight -= 1
                    timeline.events.append("answer")
                return self.handle.result()

        def submitted(ops):
            self.events.append("submit")
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            return Handle(submit(ops))

        def executed(work, copies):
            self.events.append("pass")
            return execute(work, copies)

        def sampled(logits, rows):
            self.events.append("sample")
            return sample(logits, rows)

        engine.allocator.submit, engine.runner.execute = submitted, executed
        engine.sampler.sample = sampled

    def iterations(self) -> list[list[str]]:
        """The events cut at every forward pass's Step (or at the pass, when none went)."""
        cut: list[list[str]] = []
        for event in self.events:
            if event == "submit" or (event == "pass" and (not cut or "pass" in cut[-1])):
                cut.append([])
            cut[-1].append(event)
        return cut


def engine_for(checkpoint: Path, **options):
    return build_engine(checkpoint, EngineOptions(num_blocks=256, block_size=BLOCK, **options),
                        LocalBlockAllocator())


def test_a_decode_step_is_answered_after_the_tokens_are_sampled(checkpoint):
    """Prompts of staggered lengths make some sequence ask for a block nearly every iteration
    of a steady decode; those Steps are read only after the sampling. The admission's Step is
    read before its pass."""
    engine = engine_for(checkpoint)
    timeline = Timeline(engine)
    prompts = random_prompts(list(range(5, 5 + BLOCK)), seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    generate(engine, prompts, [params] * len(prompts))
    iterations = timeline.iterations()
    assert iterations[0] == ["submit", "answer", "pass", "sample"]
    overlapped = [events for events in iterations[1:] if events[0] == "submit"]
    assert len(overlapped) > 20
    assert all(events == ["submit", "pass", "sample", "answer"] for events in overlapped[:-1])
    assert timeline.most_in_flight == 1
    assert audit_pool("local", engine.allocator.pool) == []


def test_a_beam_search_reads_its_step_before_it_samples(checkpoint):
    """Beams append every iteration, and a decision forks beams from every token recorded:
    the Step is mirrored before the sampling, so no extra Step records tokens it already
    carries, and never two are in flight."""
    engine = engine_for(checkpoint)
    timeline = Timeline(engine)
    prompt, = random_prompts([21], seed=8)
    generate(engine, [prompt], [SamplingParams(beam_width=3, n=3, max_tokens=24, temperature=0,
                                               ignore_eos=True)])
    assert all(events.index("answer") < events.index("sample")
               for events in timeline.iterations() if "sample" in events)
    assert timeline.most_in_flight == 1
    assert timeline.events.count("submit") == engine.num_steps
    assert audit_pool("local", engine.allocator.pool) == []
