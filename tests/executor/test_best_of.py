"""best_of > n: best_of samples run as forks of one prompt, and the n with the highest summed
log-probability come back whole at the end, best first."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import InvalidSamplingParams, SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint

# Twenty stop tokens out of the random model's small vocabulary: samples end at different
# lengths, some by "stop" and some by "length".
SAMPLES = SamplingParams(n=4, temperature=1.0, seed=77, max_tokens=10,
                         stop_token_ids=tuple(range(100, 120)))
BEST_2_OF_4 = replace(SAMPLES, n=2, best_of=4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


def engine_for(checkpoint: Path):
    return build_engine(checkpoint, EngineOptions(num_blocks=64), LocalBlockAllocator())


def test_the_two_most_likely_of_four_seeded_samples_come_back(checkpoint):
    """The four samples are what n = 4 with the same seed draws (each sample's generator
    follows from the seed and its index); best_of returns the two with the highest summed
    logprob of those n = 4 reports, with that sum as both score and cumulative logprob."""
    (prompt,) = random_prompts([23], seed=3)
    (all_four,) = generate(engine_for(checkpoint), [prompt], replace(SAMPLES, logprobs=0))
    sums = []
    for choice, logprobs in zip(all_four.choices, all_four.logprobs):
        sums.append(sum(entry.logprob for entry in logprobs))
    assert len(set(map(len, all_four.choices))) > 1, "the samples should end apart"
    ranked = sorted(range(4), key=lambda i: -sums[i])[:2]

    (best,) = generate(engine_for(checkpoint), [prompt], BEST_2_OF_4)
    assert best.choices == [all_four.choices[i] for i in ranked]
    assert best.finish_reasons == [all_four.finish_reasons[i] for i in ranked]
    assert best.cumulative_logprobs == pytest.approx([sums[i] for i in ranked], abs=1e-4)
    assert best.scores == best.cumulative_logprobs
    assert best.usage.completion_tokens == sum(len(choice) for choice in best.choices)


def test_logprobs_of_the_chosen_samples_are_returned(checkpoint):
    (prompt,) = random_prompts([9], seed=4)
    (all_four,) = generate(engine_for(checkpoint), [prompt], replace(SAMPLES, logprobs=2))
    (best,) = generate(engine_for(checkpoint), [prompt], replace(BEST_2_OF_4, logprobs=2))
    for choice, logprobs in zip(best.choices, best.logprobs):
        source = all_four.choices.index(choice)
        assert logprobs == all_four.logprobs[source]
        assert [entry.token_id for entry in logprobs] == choice


def test_nothing_is_streamed_before_the_ranking_and_the_pool_comes_back(checkpoint):
    (prompt, other) = random_prompts([40, 12], seed=5)
    engine = engine_for(checkpoint)
    engine.add_request("best", prompt, replace(BEST_2_OF_4, max_tokens=14))
    engine.add_request("plain", other, SamplingParams(temperature=0, max_tokens=30))
    pool = engine.allocator.pool
    seen_samples = 0
    while engine.has_work():
        for output in engine.step():
            if output.request_id == "best":
                assert output.finished, "a best_of request reports only its ranked choices"
                assert [delta.index for delta in output.deltas] == [0, 1]
        seen_samples = max(seen_samples, sum(1 for seq_id in pool.sequences
                                            if seq_id.startswith("best#")))
        assert audit_pool("best", pool) == []
    assert seen_samples == 4, "all four samples ran at once, forked from the prompt"
    assert pool.sequences == {}


def test_cancelling_reports_the_n_choices_and_frees_every_sample(checkpoint):
    (prompt,) = random_prompts([20], seed=6)
    engine = engine_for(checkpoint)
    engine.add_request("best", prompt, replace(BEST_2_OF_4, max_tokens=50,
                                               stop_token_ids=()))
    for _ in range(4):
        assert engine.step() == []
    engine.abort("best")
    (output,) = engine.drain_outputs()
    assert output.finished
    assert [(d.index, d.finish_reason, d.token_ids) for d in output.deltas] == [
        (0, "cancelled", []), (1, "cancelled", [])]
    while engine.has_work():
        engine.step()
    assert engine.allocator.pool.sequences == {}
    assert audit_pool("best", engine.allocator.pool) == []


@pytest.mark.parametrize("params, message", [
    (SamplingParams(n=3, best_of=2), "best_of must be between n (3)"),
    (SamplingParams(n=1, best_of=3, temperature=0), "best_of (3) above n needs sampling"),
])
def test_bad_best_of_is_refused_by_name(params, message):
    with pytest.raises(InvalidSamplingParams, match=message.replace("(", r"\(").replace(")", r"\)")):
        params.validate(vocab_size=320)
