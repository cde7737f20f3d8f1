"""When an engine waits for its Step's answer. A Step the forward pass depends on (an
admission) is read before the pass; any other stays in flight through the pass and the
sampling, unless a beam search samples (its decision forks beams from what the Step records).
A Step of decoding sequences stays in flight past its iteration: it is read just before the
next Step goes out, or before a pass writes a slot only its answer grants. Nothing sends a
second Step while one is in flight."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint
from tests.support.shared_writes import shared_writes

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


@pytest.mark.parametrize("seed, num_blocks", [(0, 20), (1, 32)])
def test_cancels_forks_beams_and_preemptions_with_steps_in_flight_free_every_block(
        checkpoint, seed, num_blocks):
    """Requests arriving and cancelled at random moments, some n > 1 or beam searches, in a
    pool too small for them, with Steps coalesced every 4th iteration: whatever a Step still in
    flight was for (a sequence cancelled, preempted or finished since), every request ends
    without error and every block comes back."""
    rng = random.Random(seed)
    engine = engine_for(checkpoint, num_blocks, step_interval=4)
    timeline = Timeline(engine)
    made, errors = 0, []
    for _ in range(240):
        if made < 24 and rng.random() < 0.3:
            prompt, = random_prompts([rng.randint(3, 60)], seed=rng.randint(0, 10**6))
            kind = rng.random()
            if kind < 0.1:
                params = SamplingParams(beam_width=2, n=2, max_tokens=rng.randint(4, 30),
                                        temperature=0, ignore_eos=True)
            elif kind < 0.3:
                params = SamplingParams(n=rng.choice([2, 3]), temperature=1.0, seed=made,
                                        max_tokens=rng.randint(4, 50), ignore_eos=True)
            else:
                params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 60),
                                        ignore_eos=True)
            engine.add_request(f"r{made}", prompt, params)
            made += 1
        if engine.requests and rng.random() < 0.04:
            engine.abort(rng.choice(sorted(engine.requests)))
        errors += [output.error for output in engine.step() if output.error]
    while engine.has_work():
        errors += [output.error for output in engine.step() if output.error]
    assert errors == []
    assert engine.scheduler.num_preemptions > 0
    assert timeline.most_in_flight == 1
    assert not engine.allocator.pool.sequences
    assert audit_pool("local", engine.allocator.pool) == []


def test_choices_fork_while_the_step_of_their_prompts_last_chunk_is_in_flight(checkpoint):
    """Prompts computed in chunks of 16 tokens, then forked into n = 3 choices: a prompt's last
    chunk goes out in a Step of its own that may still be in flight when the choices are
    forked (its tokens were recorded by the Allocate; it is read, and reaches the allocator,
    before the Fork's Step). No choice writes into the block it shares with the others, and the
    choices are those of Steps coalesced less."""
    prompts = random_prompts([20, 33, 45], seed=12)
    params = [SamplingParams(n=3, temperature=1.0, seed=index, max_tokens=20, ignore_eos=True)
              for index in range(len(prompts))]
    runs, forks_behind_a_step = [], []
    for step_interval in (4, 2):
        engine = engine_for(checkpoint, step_interval=step_interval, max_num_batched_tokens=16)
        written_shared = shared_writes(engine)
        forks_behind_a_step.append(count_forks_behind_a_step(engine))
        runs.append([output.choices for output in generate(engine, prompts, params)])
        assert written_shared == []
        assert not engine.allocator.pool.sequences
        assert audit_pool("local", engine.allocator.pool) == []
    assert forks_behind_a_step[0] == [2]  # at interval 2 the Step is read before the forks
    assert runs[0] == runs[1]


def count_forks_behind_a_step(engine) -> list[int]:
    """Wraps the scheduler's plan: how many children were forked from a parent whose last
    Append was in a Step not read yet (one-element list, filled as the engine runs)."""
    count, scheduler, plan = [0], engine.scheduler, engine.scheduler.plan

    def counted():
        count[0] += sum(seq.fork_parent in scheduler.unanswered
                        for request in scheduler.running for seq in request.sequences
                        if seq.fork_parent is not None)
        return plan()

    scheduler.plan = counted
    return count
