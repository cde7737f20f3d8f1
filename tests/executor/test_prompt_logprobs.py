"""Prompt logprobs (prompt scoring): each prompt token's log-probability given the tokens before
it, read off the prefill's logits, equal to transformers' whether the prompt is computed whole,
in chunks, or partly found in the prefix cache."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint

SCORE = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=3, ignore_eos=True)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def checkpoint(request, tmp_path_factory) -> Path:
    return write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def reference(checkpoint: Path, prompt: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every position but the last: [P - 1, vocab]."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def engine_of(checkpoint: Path, **options):
    return build_engine(checkpoint, EngineOptions(num_blocks=64, **options),
                        LocalBlockAllocator())


def check_against(expected: torch.Tensor, prompt: list[int], scored) -> None:
    assert [entry.token_id for entry in scored] == prompt[1:]
    for position, entry in enumerate(scored):
        row = expected[position]
        assert entry.logprob == pytest.approx(row[prompt[position + 1]].item(), abs=1e-4)
        assert entry.rank == int((row > row[prompt[position + 1]]).sum()) + 1
        top_values, top_ids = row.topk(3)
        assert [token for token, _ in entry.top] == top_ids.tolist()
        assert [value for _, value in entry.top] == pytest.approx(top_values.tolist(), abs=1e-4)


def test_prompt_logprobs_equal_transformers_whole_and_chunked(checkpoint):
    prompt, other = random_prompts([45, 30], seed=11)
    expected = reference(checkpoint, prompt)
    (whole,) = generate(engine_of(checkpoint), [prompt], SCORE)
    check_against(expected, prompt, whole.prompt_logprobs)
    # Chunks of 16 tokens shared with another prompt's prefill: scored across four passes.
    chunked = generate(engine_of(checkpoint, max_num_batched_tokens=16), [other, prompt],
                       [SamplingParams(max_tokens=4, temperature=0), SCORE])
    check_against(expected, prompt, chunked[1].prompt_logprobs)
    assert chunked[0].prompt_logprobs is None
    # Scoring does not change what is generated.
    assert chunked[1].choices == whole.choices


def test_a_cached_prefix_is_scored_without_writing_its_shared_blocks(checkpoint):
    (prompt,) = random_prompts([50], seed=12)
    expected = reference(checkpoint, prompt)
    engine = engine_of(checkpoint)
    # A request without scoring leaves the prompt's three full blocks in the prefix cache.
    generate(engine, [prompt], SamplingParams(max_tokens=2, temperature=0))
    (scored,) = generate(engine, [prompt], SCORE)
    assert scored.usage.cached_tokens == 48
    check_against(expected, prompt, scored.prompt_logprobs)
    # While another request holds the cached blocks, a scoring request shares them too.
    engine.add_request("holder", prompt, SamplingParams(max_tokens=30, temperature=0,
                                                        ignore_eos=True))
    engine.step()
    engine.add_request("scorer", prompt, SCORE)
    scores = None
    while engine.has_work():
        for output in engine.step():
            if output.request_id == "scorer" and output.prompt_logprobs is not None:
                scores = output.prompt_logprobs
                assert audit_pool("scorer", engine.allocator.pool) == []
    check_against(expected, prompt, scores)
    assert audit_pool("scorer", engine.allocator.pool) == []


def test_top_zero_and_a_one_token_prompt(checkpoint):
    (prompt,) = random_prompts([9], seed=13)
    result, single = generate(engine_of(checkpoint), [prompt, [prompt[0]]],
                              SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    assert [entry.top for entry in result.prompt_logprobs] == [[]] * 8
    # Nothing comes before a lone token to score it on: an empty list, and a token generated.
    assert single.prompt_logprobs == []
    assert len(single.choices[0]) == 1


def test_prompt_logprobs_out_of_range_or_with_beam_search_are_refused():
    with pytest.raises(ValueError, match="prompt_logprobs must be between 0 and 20"):
        SamplingParams(prompt_logprobs=21).validate(100)
    with pytest.raises(ValueError, match="prompt_logprobs is not supported with beam search"):
        SamplingParams(beam_width=2, prompt_logprobs=1).validate(100)
