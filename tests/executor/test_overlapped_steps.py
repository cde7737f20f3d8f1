"""When an engine waits for its Step's answer. A Step the forward pass depends on (an
admission) is read before the pass; any other stays in flight through the pass and the
sampling, unless a beam search samples (its decision forks beams from what the Step records).
A Step of decoding sequences stays in flight past its iteration: it is read just before the
next Step goes out, or before a pass writes a slot only its answer grants. Nothing sends a
second Step while one is in flight."""
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

    def passes_in_flight(self) -> list[int]:
        """For each Step read after a forward pass began: the passes that ran while it was
        in flight."""
        counts, passes = [], None
        for event in self.events:
            if event == "submit":
                passes = 0
            elif event == "pass" and passes is not None:
                passes += 1
            elif event == "answer":
                if passes:
                    counts.append(passes)
                passes = None
        return counts

    def iterations(self) -> list[list[str]]:
        """The events cut at every forward pass's Step (or at the pass, when none went)."""
        cut: list[list[str]] = []
        for event in self.events:
            if event == "submit" or (event == "pass" and (not cut or "pass" in cut[-1])):
                cut.append([])
            cut[-1].append(event)
        return cut


def engine_for(checkpoint: Path, num_blocks: int = 256, **options):
    return build_engine(checkpoint, EngineOptions(num_blocks=num_blocks, block_size=BLOCK,
                                                  **options), LocalBlockAllocator())


def staggered_decode(checkpoint: Path, num_blocks: int = 256, max_tokens: int = 40,
                     **options):
    """Greedy requests whose prompts, of staggered lengths, make some sequence ask for a block
    nearly every iteration: the engine, its timeline and the choices."""
    engine = engine_for(checkpoint, num_blocks, **options)
    timeline = Timeline(engine)
    prompts = random_prompts(list(range(5, 5 + BLOCK)), seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    choices = [output.choices for output in generate(engine, prompts, [params] * len(prompts))]
    assert timeline.most_in_flight == 1
    assert not engine.allocator.pool.sequences
    assert audit_pool("local", engine.allocator.pool) == []
    return engine, timeline, choices


def test_a_decode_step_is_answered_after_the_tokens_are_sampled(checkpoint):
    """Some sequence asks for a block nearly every iteration of this steady decode; those
    Steps are read only after the sampling (just before the next goes out). The admission's
    Step is read before its pass."""
    _, timeline, _ = staggered_decode(checkpoint)
    iterations = timeline.iterations()
    assert iterations[0] == ["submit", "answer", "pass", "sample"]
    overlapped = [events for events in iterations[1:] if events[0] == "submit"]
    assert len(overlapped) > 20
    assert all(events == ["submit", "pass", "sample", "answer"] for events in overlapped[:-1])


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


def test_a_coalesced_step_is_read_just_before_the_next_goes_out(checkpoint):
    """With Steps coalesced every 4th iteration, a decode's Step is read only when the next
    one is sent: four passes ran while it was in flight, not one. The tokens are those of a
    Step read every iteration."""
    engine, timeline, choices = staggered_decode(checkpoint, step_interval=4)
    _, _, every_iteration = staggered_decode(checkpoint, step_interval=1)
    assert choices == every_iteration
    # The admission's Step, read before its pass, is not counted; the last ones are read
    # sooner, as requests finish and their Frees go out.
    in_flight = timeline.passes_in_flight()
    assert len(in_flight) > 8
    assert in_flight.count(4) >= len(in_flight) - 2 and max(in_flight) == 4
    events = timeline.events
    reads = [index for index, event in enumerate(events) if event == "answer"]
    assert all(index + 1 == len(events) or events[index + 1] == "submit"
               for index in reads[1:])
    assert engine.scheduler.num_stalls == 0


def test_a_lone_decode_reads_its_step_when_its_reserve_runs_out(checkpoint):
    """One sequence, Steps every 8th iteration at most: its Append reserves a whole block,
    which it writes only once the block before is full, so the Step stays out for the
    iterations its mirrored slots last, and is read before the pass that needs the new
    block (no stall, the same tokens)."""
    prompt, = random_prompts([9], seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)]
    lone = engine_for(checkpoint, step_interval=8)
    timeline = Timeline(lone)
    tokens = generate(lone, [prompt], params)[0].choices
    assert tokens == generate(engine_for(checkpoint, step_interval=1), [prompt],
                              params)[0].choices
    in_flight = timeline.passes_in_flight()
    assert in_flight[:3] == [BLOCK] * 3
    assert lone.scheduler.num_stalls == 0
    assert audit_pool("local", lone.allocator.pool) == []


def test_preemptions_with_steps_in_flight_give_the_same_tokens(checkpoint):
    """A pool too small for every sequence: answers that refuse a reserve, read iterations
    after their Step went out, lead to the preemptions a Step read at once leads to, and the
    recomputed requests give the same tokens."""
    engine, _, coalesced = staggered_decode(checkpoint, num_blocks=24, max_tokens=48,
                                            step_interval=4)
    assert engine.scheduler.num_preemptions > 0
    _, _, every_iteration = staggered_decode(checkpoint, num_blocks=24, max_tokens=48,
                                             step_interval=1)
    assert coalesced == every_iteration
