"""Beam search gives transformers' hypotheses and scores: first the decisions alone
(beam_search.py fed transformers' own logits), then the engine on every supported architecture,
beams forked and freed on copy-on-write blocks, in a crowded batch of other requests, through
chunked prefill, a prefix-cache hit and preemption, the pool's audit clean after every step."""
from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.beam_search import BeamSearch
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import Completion
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.sampling_params import InvalidSamplingParams, SamplingParams
from tests.support.model_checkpoints import ARCHITECTURES, random_prompts, write_checkpoint

MAX_NEW = 10
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# (length_penalty, early_stopping): transformers' default, and each other branch it has.
SETTINGS = [(1.0, False), (0.5, True), (2.0, "never"), (-1.0, "never")]


def transformers_beams(model, prompt: list[int], width: int, n: int, stop: int | None,
                       length_penalty: float = 1.0, early_stopping=False,
                       max_new: int = MAX_NEW) -> tuple[list[list[int]], list[float]]:
    """transformers' n best hypotheses (generated tokens, padding cut) and their scores."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=model.device),
                             max_new_tokens=max_new, do_sample=False, num_beams=width,
                             num_return_sequences=n,
                             length_penalty=length_penalty, early_stopping=early_stopping,
                             eos_token_id=stop, pad_token_id=0, return_dict_in_generate=True,
                             output_scores=True)
    hypotheses = []
    for row in out.sequences.tolist():
        generated = row[len(prompt):]
        if stop is not None and stop in generated:
            generated = generated[:generated.index(stop) + 1]
        hypotheses.append(generated)
    return hypotheses, out.sequences_scores.tolist()


def likely_stop_token(model, prompts: list[list[int]]) -> int:
    """A token the model generates often, so hypotheses end on it within MAX_NEW tokens and
    the stop path is exercised (a random model rarely picks its configured eos)."""
    counts = Counter()
    for prompt in prompts:
        hypotheses, _ = transformers_beams(model, prompt, 4, 4, None)
        counts.update(token for hypothesis in hypotheses for token in hypothesis[1:4])
    for token, _ in counts.most_common(10):
        for width in (2, 4, 8):
            hypotheses, _ = transformers_beams(model, prompts[width % len(prompts)], width,
                                               width, token)
            if any(hypothesis[-1] == token for hypothesis in hypotheses):
                return token
    raise AssertionError("no likely token ends a hypothesis")


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def checkpoint(request, tmp_path_factory):
    directory = write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    prompts = random_prompts([5, 23, 40], seed=len(request.param))
    return directory, model, prompts, likely_stop_token(model, prompts)


def test_decisions_match_transformers_on_its_own_logits(checkpoint):
    """beam_search.py alone, every width and early_stopping / length_penalty branch, with a
    stop token the beams do reach."""
    _, model, prompts, stop = checkpoint
    stopped = 0
    for width in (2, 4, 8):
        for length_penalty, early_stopping in SETTINGS:
            prompt = prompts[width % len(prompts)]
            expected, expected_scores = transformers_beams(
                model, prompt, width, width, stop, length_penalty, early_stopping)
            search = BeamSearch(width, length_penalty=length_penalty,
                                early_stopping=early_stopping, num_prompt_tokens=len(prompt),
                                max_length=len(prompt) + MAX_NEW, stop_token_ids={stop})
            beams: list[list[int]] = [[] for _ in range(width)]
            while not search.done:
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + beam for beam in beams])).logits
                chosen = search.step(torch.log_softmax(logits[:, -1, :].float(), dim=-1), beams)
                beams = [beams[c.parent] + [c.token_id] for c in chosen]
            best = search.best(width)
            assert [h.token_ids for h in best] == expected
            assert [h.score for h in best] == pytest.approx(expected_scores, rel=1e-5, abs=1e-4)
            stopped += sum(h.finish_reason == "stop" for h in best)
    assert stopped > 0


def run_checked(engine, requests: list[tuple[list[int], SamplingParams]]) -> list[Completion]:
    """Steps the engine to the end, auditing the pool after every step."""
    completions = {}
    for index, (prompt, params) in enumerate(requests):
        engine.add_request(f"r{index}", prompt, params)
        completions[f"r{index}"] = Completion(f"r{index}", [[] for _ in range(params.n)],
                                              [None] * params.n, [None] * params.n,
                                              [None] * params.n)
    pool = engine.allocator.pool
    for _ in range(10_000):
        if not engine.has_work():
            break
        for output in engine.step():
            completion = completions[output.request_id]
            assert output.error is None
            for delta in output.deltas:
                completion.choices[delta.index] += delta.token_ids
                completion.finish_reasons[delta.index] = delta.finish_reason
                completion.scores[delta.index] = delta.score
        assert audit_pool("engine", pool) == []
    assert not engine.has_work() and pool.sequences == {}
    return list(completions.values())


def beam(width: int, stop: int, n: int | None = None) -> SamplingParams:
    return SamplingParams(beam_width=width, n=n or width, max_tokens=MAX_NEW, temperature=0,
                          stop_token_ids=(stop,), ignore_eos=True)


def assert_matches(model, completion: Completion, prompt: list[int], params: SamplingParams):
    expected, scores = transformers_beams(model, prompt, params.beam_width, params.n,
                                          params.stop_token_ids[0])
    assert completion.choices == expected
    assert completion.scores == pytest.approx(scores, rel=1e-5, abs=1e-4)
    assert completion.finish_reasons == [
        "stop" if choice[-1] == params.stop_token_ids[0] else "length" for choice in expected]


def test_engine_beams_in_a_crowded_batch_with_chunked_prefill(checkpoint):
    """Widths 2, 4 and 8 next to greedy and sampled requests, prompts cut into chunks of a
    16-token budget."""
    directory, model, prompts, stop = checkpoint
    engine = build_engine(directory, EngineOptions(num_blocks=160, max_num_batched_tokens=16),
                          LocalBlockAllocator())
    beams = [(prompts[0], beam(2, stop)), (prompts[1], beam(4, stop, n=2)),
             (prompts[2], beam(8, stop))]
    others = [(prompts[2], SamplingParams(temperature=0, max_tokens=MAX_NEW)),
              (prompts[1], SamplingParams(n=3, max_tokens=MAX_NEW, seed=7))]
    completions = run_checked(engine, beams + others)
    for completion, (prompt, params) in zip(completions, beams):
        assert_matches(model, completion, prompt, params)


@pytest.mark.gpu
@needs_cuda
def test_engine_beams_on_cuda_match_transformers_on_cuda(checkpoint):
    """The same crowded batch with the KV cache, the model and the paged kernels on the GPU
    (float32), against transformers' beam search on the GPU."""
    directory, _, prompts, stop = checkpoint
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to("cuda").eval()
    engine = build_engine(directory, EngineOptions(device="cuda", dtype="float32",
                                                   num_blocks=160, max_num_batched_tokens=16),
                          LocalBlockAllocator())
    beams = [(prompts[0], beam(2, stop)), (prompts[1], beam(4, stop, n=2)),
             (prompts[2], beam(8, stop))]
    others = [(prompts[2], SamplingParams(temperature=0, max_tokens=MAX_NEW))]
    completions = run_checked(engine, beams + others)
    for completion, (prompt, params) in zip(completions, beams):
        assert_matches(model, completion, prompt, params)


def test_engine_beams_through_a_prefix_cache_hit_and_preemption(checkpoint):
    """A second beam search whose prompt's first 32 tokens are cached; then three at once in
    a pool too small for them, so beam searches are preempted and their beams recomputed."""
    directory, model, prompts, stop = checkpoint
    engine = build_engine(directory, EngineOptions(num_blocks=160), LocalBlockAllocator())
    shared = prompts[2][:32]
    run_checked(engine, [(shared + [5, 6], beam(4, stop))])
    (hit,) = run_checked(engine, [(shared + [7], beam(4, stop))])
    assert_matches(model, hit, shared + [7], beam(4, stop))

    engine = build_engine(directory, EngineOptions(num_blocks=14, max_num_batched_tokens=48),
                          LocalBlockAllocator())
    requests = [(prompts[2], beam(4, stop)), (prompts[1], beam(4, stop)),
                (prompts[0], beam(2, stop))]
    completions = run_checked(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    for completion, (prompt, params) in zip(completions, requests):
        assert_matches(model, completion, prompt, params)


def test_shared_blocks_and_copies(tmp_path):
    """Forked beams share every full block: at width 4 a 100-token prompt is held once, and
    a beam chosen twice copies only its partly filled last block."""
    directory = write_checkpoint("llama", tmp_path)
    engine = build_engine(directory, EngineOptions(num_blocks=64), LocalBlockAllocator())
    prompt = random_prompts([100], seed=3)[0]
    engine.add_request("r", prompt, SamplingParams(beam_width=4, n=4, max_tokens=8,
                                                   temperature=0, ignore_eos=True))
    pool, held = engine.allocator.pool, 0
    while engine.has_work():
        engine.step()
        held = max(held, pool.num_blocks - pool.num_free_blocks)
        assert audit_pool("engine", pool) == []
    # Unshared, 4 beams of 108 tokens (+ reserve) would hold 4 * 7 blocks.
    assert held <= 6 + 4 * 2


@pytest.mark.parametrize("params, field", [
    (SamplingParams(beam_width=2, n=3), "n (3) must not exceed beam_width"),
    (SamplingParams(beam_width=2, top_p=0.5), "top_p is not supported with beam search"),
    (SamplingParams(beam_width=2, seed=1), "seed is not supported with beam search"),
    (SamplingParams(beam_width=2, temperature=0.7), "temperature is not supported with beam"),
    (SamplingParams(beam_width=2, logprobs=1), "logprobs is not supported with beam search"),
    (SamplingParams(length_penalty=2.0), "apply only to beam search"),
    (SamplingParams(early_stopping=True), "apply only to beam search"),
    (SamplingParams(beam_width=2, early_stopping="always"), "early_stopping must be"),
    (SamplingParams(beam_width=-1), "beam_width must be >= 0"),
    (SamplingParams(beam_width=2, best_of=2), "best_of does not combine with beam search"),
])
def test_bad_beam_parameters_are_refused_by_name(params, field):
    with pytest.raises(InvalidSamplingParams, match=re.escape(field)):
        params.validate(vocab_size=320)


def test_width_above_the_configured_maximum_is_refused(tmp_path):
    directory = write_checkpoint("llama", tmp_path)
    engine = build_engine(directory, EngineOptions(num_blocks=32, max_beam_width=4),
                          LocalBlockAllocator())
    with pytest.raises(InvalidArgument, match="above this executor's maximum"):
        engine.add_request("r", [5, 6, 7], SamplingParams(beam_width=8))
    assert not engine.has_work()


def test_cancelling_a_beam_search_frees_every_beam(tmp_path):
    directory = write_checkpoint("llama", tmp_path)
    engine = build_engine(directory, EngineOptions(num_blocks=32), LocalBlockAllocator())
    engine.add_request("r", [5, 6, 7, 8], SamplingParams(beam_width=4, max_tokens=50,
                                                         ignore_eos=True))
    for _ in range(5):
        engine.step()
    engine.abort("r")
    while engine.has_work():
        engine.step()
    pool = engine.allocator.pool
    assert pool.sequences == {} and audit_pool("engine", pool) == []
    assert pool.num_free_blocks == pool.num_blocks
