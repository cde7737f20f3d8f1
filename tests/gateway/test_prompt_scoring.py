"""Prompt scoring over the HTTP and gRPC APIs: completions' `echo` with `logprobs` (what
lm-eval's loglikelihood tasks send), `max_tokens: 0`, vLLM's `prompt_logprobs`, against a real
stack. The engine's scores are checked against transformers in
tests/executor/test_prompt_logprobs.py; here, each echoed score must agree with what the API
itself reports for the same position when it generates there."""
from __future__ import annotations

import httpx
import pytest

from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc

MODEL = "pagedserve-embedded-llama"
PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def prompt_ids(stack) -> list[int]:
    _, gateway = stack
    answer = httpx.post(f"{gateway.http_url}/tokenize", json={"prompt": PROMPT}, timeout=30)
    return answer.json()["tokens"]


def test_lm_eval_loglikelihood_request(client, prompt_ids):
    """lm-eval's exact body: the prompt's tokens scored, then one greedy token."""
    answer = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=1,
                                       logprobs=1, echo=True, temperature=0)
    (choice,) = answer.choices
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(prompt_ids) + 1
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    # Each prompt token's alternatives hold the most likely token and the token itself.
    for position in range(1, len(prompt_ids)):
        top = logprobs.top_logprobs[position]
        assert 1 <= len(top) <= 2
        assert logprobs.token_logprobs[position] in top.values()
        assert max(top.values()) >= logprobs.token_logprobs[position]
    # The text is the prompt's, then the generated token's; offsets count along it.
    assert choice.text.startswith(PROMPT) or choice.text.startswith(
        "".join(logprobs.tokens[:len(prompt_ids)]))
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    assert answer.usage.prompt_tokens == len(prompt_ids)
    assert answer.usage.completion_tokens == 1


def test_each_prompt_score_is_what_generating_there_reports(client, prompt_ids):
    """Position i's best alternative is the greedy token after prompt[:i], with the logprob a
    generation from prompt[:i] reports for it."""
    echoed = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=1,
                                       logprobs=1, echo=True, temperature=0).choices[0].logprobs
    for cut in (1, 3, len(prompt_ids) - 1):
        generated = client.completions.create(model=MODEL, prompt=prompt_ids[:cut],
                                              max_tokens=1, logprobs=1, temperature=0,
                                              extra_body={"ignore_eos": True})
        best_token, best = next(iter(generated.choices[0].logprobs.top_logprobs[0].items()))
        assert best == pytest.approx(max(echoed.top_logprobs[cut].values()), abs=1e-4)
        assert best_token in echoed.top_logprobs[cut]


def test_max_tokens_0_echoes_and_scores_without_generating(client, prompt_ids):
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True,
                                       logprobs=0)
    (choice,) = answer.choices
    assert choice.text == PROMPT
    assert choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(prompt_ids)
    assert answer.usage.completion_tokens == 0
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert plain.choices[0].text == PROMPT and plain.choices[0].logprobs is None


def test_echo_of_a_batch_streamed_or_not(client):
    prompts = ["Once upon a time", "In a hole in the ground"]
    whole = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, echo=True,
                                      temperature=0, logprobs=1,
                                      extra_body={"ignore_eos": True})
    texts = {choice.index: choice.text for choice in whole.choices}
    assert texts[0].startswith(prompts[0]) and texts[1].startswith(prompts[1])
    streamed = {0: "", 1: ""}
    for chunk in client.completions.create(model=MODEL, prompt=prompts, max_tokens=4,
                                           echo=True, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True}):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts


def test_vllm_prompt_logprobs_shape(client, prompt_ids):
    answer = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=2,
                                       temperature=0, extra_body={"prompt_logprobs": 2})
    (choice,) = answer.model_dump()["choices"]
    scores = choice["prompt_logprobs"]
    assert len(scores) == len(prompt_ids) and scores[0] is None
    for position, entry in enumerate(scores[1:], start=1):
        actual = entry[str(prompt_ids[position])]
        assert actual["rank"] >= 1 and actual["logprob"] <= 0
        ranked = sorted(entry.values(), key=lambda item: -item["logprob"])
        assert ranked[0]["logprob"] >= actual["logprob"]
        assert 2 <= len(entry) <= 3
    assert choice["logprobs"] is None   # prompt_logprobs alone asks for no output logprobs
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
        extra_body={"prompt_logprobs": 0})
    chat_scores = chat.model_dump()["prompt_logprobs"]
    assert chat_scores[0] is None and all(len(entry) == 1 for entry in chat_scores[1:])
    assert len(chat_scores) == chat.usage.prompt_tokens


@pytest.mark.parametrize("body, message", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens must be >= 1, or 0 to score or echo"),
    ({"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs -1 (the whole vocabulary)"),
    ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs must be between 0 and 20"),
    ({"prompt": "x", "prompt_logprobs": 1, "stream": True},
     "prompt_logprobs are not available when stream is true"),
    ({"prompt": "x", "echo": True, "logprobs": 1, "use_beam_search": True, "n": 2,
      "temperature": 0}, "prompt_logprobs is not supported with beam search"),
])
def test_scoring_requests_refused(stack, body, message):
    _, gateway = stack
    answer = httpx.post(f"{gateway.http_url}/v1/completions", json={"model": MODEL, **body},
                        timeout=30)
    assert answer.status_code == 400, answer.text
    assert message in answer.json()["error"]["message"]


def test_grpc_prompt_logprobs_and_max_tokens_0(stack, prompt_ids):
    _, gateway = stack
    stub = pb_grpc.GatewayStub(gateway.channel())
    responses = list(stub.Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=prompt_ids),
        sampling=pb.SamplingOptions(max_tokens=0, prompt_logprobs=1)), timeout=60))
    scores = [entry for response in responses for entry in response.prompt_logprobs]
    assert [entry.token_id for entry in scores] == prompt_ids[1:]
    assert all(entry.HasField("rank") and len(entry.top) == 1 for entry in scores)
    assert not any(choice.token_ids for response in responses for choice in response.choices)
    assert responses[-1].usage.completion_tokens == 0
