"""The OpenAI-compatible HTTP API, driven by the official `openai` package against real
allocator, executor and gateway processes (API keys on)."""
from __future__ import annotations

import time

import grpc
import httpx
import openai
import pytest

from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import GatewayProcess, gateway_stack, pagedctl_audit
from tests.support.allocator_wire import REFLECTION, REFLECTION_V1, reflection_services, used_blocks
from tests.support.polling import wait_for

MODEL = "pagedserve-embedded-llama"
KEY = "sk-test-key"
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with gateway_stack(tmp_path_factory.mktemp("cache"), gateway_args=(
            "--api-key", "other-key", "--api-key", KEY)) as stack:
        yield stack


@pytest.fixture
def client(stack) -> openai.OpenAI:
    _, gateway = stack
    with openai.OpenAI(base_url=f"{gateway.http_url}/v1", api_key=KEY, max_retries=0,
                       timeout=60) as client:
        yield client


def grpc_greedy_text(gateway: GatewayProcess, **prompt) -> str:
    stub = pb_grpc.GatewayStub(gateway.channel())
    responses = stub.Generate(pb.GenerateRequest(**prompt, sampling=pb.SamplingOptions(
        temperature=0, max_tokens=16, ignore_eos=True)), timeout=60,
        metadata=[("authorization", f"Bearer {KEY}")])
    return "".join(c.text for r in responses for c in r.choices)


def test_a_completion_equals_the_grpc_answer_streamed_or_not(stack, client):
    allocator, gateway = stack
    whole = client.completions.create(model=MODEL, prompt="Hello, HTTP", max_tokens=16,
                                      **GREEDY)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    (choice,) = whole.choices
    assert choice.text == grpc_greedy_text(gateway, text="Hello, HTTP")
    assert choice.finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens,
            whole.usage.total_tokens) == (11, 16, 27)
    chunks = list(client.completions.create(model=MODEL, prompt="Hello, HTTP", max_tokens=16,
                                            stream=True, **GREEDY))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    wait_for(lambda: used_blocks(allocator) == 0)


def test_a_chat_completion_streamed_equals_the_whole_one(stack, client):
    _, gateway = stack
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say something"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                           **GREEDY)
    assert whole.object == "chat.completion"
    message = whole.choices[0].message
    assert message.role == "assistant" and message.content
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(**m) for m in messages])
    assert message.content == grpc_greedy_text(gateway, chat=chat)[:len(message.content)]
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_a_batch_of_prompts_answers_each_as_alone_numbered_prompt_by_prompt(stack, client):
    allocator, _ = stack
    prompts = ["Hello", [72, 105, 33], "Bye"]
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=5, n=2, seed=3,
                                       temperature=0.8, extra_body={"ignore_eos": True})
             for p in prompts]
    batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, n=2, seed=3,
                                      temperature=0.8, extra_body={"ignore_eos": True})
    assert [c.index for c in batch.choices] == list(range(6))
    assert [c.text for c in batch.choices] == [c.text for a in alone for c in a.choices]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 30
    chunks = list(client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=5, n=2, seed=3, temperature=0.8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    streamed = {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [streamed[i] for i in range(6)] == [c.text for c in batch.choices]
    assert chunks[-1].usage.completion_tokens == 30
    # One prompt too long for the context window refuses the whole batch; nothing is held.
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=["ok", "y" * 100_000], max_tokens=5)
    wait_for(lambda: used_blocks(allocator) == 0)


def test_n_2_and_logprobs_over_http(client):
    whole = client.completions.create(model=MODEL, prompt="Pick", max_tokens=6, n=2, seed=5,
                                      temperature=1.0, logprobs=2,
                                      extra_body={"ignore_eos": True})
    assert [c.index for c in whole.choices] == [0, 1]
    for choice in whole.choices:
        logprobs = choice.logprobs
        assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
        assert all(len(top) <= 2 for top in logprobs.top_logprobs)
        assert logprobs.text_offset[0] == 0
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                  "content": "hi"}],
                                          max_tokens=4, logprobs=True, top_logprobs=3,
                                          **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(entry.top_logprobs) == 3 for entry in content)
    assert all(entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)
               for entry in content)


def test_beam_search_over_http_and_grpc(stack, client):
    """vLLM's spelling over HTTP (use_beam_search, n as the width) and the gateway's gRPC
    beam_width give the same hypotheses, best first, whole at the end; the beams' blocks all
    come back and the allocator's audit stays clean."""
    allocator, gateway = stack
    beam = dict(temperature=0, extra_body={"use_beam_search": True, "ignore_eos": True,
                                           "length_penalty": 0.5, "early_stopping": True})
    whole = client.completions.create(model=MODEL, prompt="Beams over", max_tokens=8, n=4,
                                      **beam)
    texts = [choice.text for choice in whole.choices]
    assert [c.index for c in whole.choices] == [0, 1, 2, 3] and len(set(texts)) == 4
    assert whole.usage.completion_tokens == 4 * 8
    stub = pb_grpc.GatewayStub(gateway.channel())
    sampling = pb.SamplingOptions(max_tokens=8, n=4, beam_width=4, temperature=0,
                                  ignore_eos=True, length_penalty=0.5,
                                  early_stopping=pb.EARLY_STOPPING_TRUE)
    responses = list(stub.Generate(pb.GenerateRequest(text="Beams over", sampling=sampling),
                                   timeout=60, metadata=[("authorization", f"Bearer {KEY}")]))
    choices = sorted((c for r in responses for c in r.choices), key=lambda c: c.index)
    assert [c.text for c in choices] == texts
    scores = [c.score for c in choices]
    assert scores == sorted(scores, reverse=True)
    assert all(c.cumulative_logprob == pytest.approx(c.score * 8 ** 0.5, rel=1e-5)
               for c in choices)
    streamed = list(client.completions.create(model=MODEL, prompt="Beams over", max_tokens=8,
                                              n=4, stream=True, **beam))
    assert {c.choices[0].index: c.choices[0].text for c in streamed
            if c.choices and c.choices[0].text} == dict(enumerate(texts))
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                  "content": "hi"}],
                                          max_tokens=5, n=2, **beam)
    assert len(chat.choices) == 2
    with pytest.raises(openai.BadRequestError, match="top_p is not supported with beam"):
        client.completions.create(model=MODEL, prompt="x", n=2, top_p=0.5, **beam)
    with pytest.raises(openai.BadRequestError, match="early_stopping must be"):
        client.completions.create(model=MODEL, prompt="x", n=2, temperature=0,
                                  extra_body={"use_beam_search": True, "early_stopping": "soon"})
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout


def test_best_of_returns_the_most_likely_samples(stack, client):
    """best_of 4, n 2 over HTTP returns the two of the four seeded samples (what n 4 with that
    seed draws) whose token logprobs sum highest, best first; streamed, the same two come whole
    at the end."""
    allocator, _ = stack
    sampled = dict(model=MODEL, prompt="Pick the best", max_tokens=6, temperature=1.0, seed=7,
                   logprobs=0, extra_body={"ignore_eos": True})
    four = client.completions.create(n=4, **sampled)
    likelihood = [sum(c.logprobs.token_logprobs) for c in four.choices]
    assert len(set(likelihood)) > 1, "the samples should differ"
    ranked = sorted(range(4), key=lambda index: -likelihood[index])[:2]
    best = client.completions.create(n=2, best_of=4, **sampled)
    assert [c.text for c in best.choices] == [four.choices[index].text for index in ranked]
    assert best.usage.completion_tokens == 2 * 6
    streamed = list(client.completions.create(n=2, best_of=4, stream=True, **sampled))
    assert {c.choices[0].index: c.choices[0].text for c in streamed
            if c.choices and c.choices[0].text} == {c.index: c.text for c in best.choices}
    with pytest.raises(openai.BadRequestError, match="best_of .* needs sampling") as refused:
        client.completions.create(model=MODEL, prompt="x", best_of=2, temperature=0)
    assert refused.value.body["param"] == "best_of"
    wait_for(lambda: used_blocks(allocator) == 0)


def test_models_list_and_retrieve(client):
    (model,) = client.models.list().data
    assert model.id == MODEL
    assert time.time() - 3600 < model.created <= time.time()
    assert model.model_extra["root"] == MODEL
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17")


def test_tokenizer_endpoints_round_trip_and_agree_with_generation(stack, client):
    _, gateway = stack
    auth = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gateway.http_url, headers=auth, timeout=30) as http:
        info = http.get("/tokenizer_info").json()
        assert info["model_max_length"] > 0 and "chat_template" in info
        plain = http.post("/tokenize", json={"prompt": "Hello, HTTP",
                                             "add_special_tokens": False}).json()
        special = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello, HTTP",
                                               "return_token_strs": True}).json()
        # The completions endpoint counts the prompt as /tokenize does by default.
        usage = client.completions.create(model=MODEL, prompt="Hello, HTTP", max_tokens=1,
                                          temperature=0).usage
        assert special["count"] == usage.prompt_tokens == len(special["tokens"])
        assert len(special["token_strs"]) == special["count"]
        assert plain["token_strs"] is None and len(plain["tokens"]) <= special["count"]
        text = http.post("/detokenize", json={"tokens": plain["tokens"]}).json()["prompt"]
        assert text == "Hello, HTTP"
        chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        chat_usage = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1).usage
        assert chat.json()["count"] == chat_usage.prompt_tokens
        for path, body, param in [("/tokenize", {"prompt": "x", "bogus": 1}, "bogus"),
                                  ("/tokenize", {}, "prompt"),
                                  ("/detokenize", {"tokens": [10 ** 9]}, "tokens")]:
            refused = http.post(path, json=body)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param
        assert httpx.post(f"{gateway.http_url}/tokenize", json={"prompt": "x"}).status_code \
            == 401


def test_probes_version_cors_and_both_reflection_versions(stack):
    _, gateway = stack
    for version in (REFLECTION, REFLECTION_V1):
        assert "pagedserve.gateway.v1.Gateway" in reflection_services(gateway.channel(), version)
    with httpx.Client(base_url=gateway.http_url, timeout=30) as http:
        assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200
        assert http.get("/version").json()["version"]
        preflight = http.options("/v1/chat/completions", headers={
            "origin": "http://localhost:3000", "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "*"
        assert "POST" in preflight.headers["access-control-allow-methods"]


@pytest.mark.parametrize("key, message", [
    (None, "missing 'authorization: Bearer <token>'"),
    ("sk-wrong", "wrong bearer token"),
])
def test_a_missing_or_wrong_api_key_is_refused_on_http_and_grpc(stack, key, message):
    _, gateway = stack
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    response = httpx.post(f"{gateway.http_url}/v1/completions", headers=headers,
                          json={"model": MODEL, "prompt": "x"})
    assert response.status_code == 401
    error = response.json()["error"]
    assert message in error["message"] and error["type"] == "authentication_error"
    metadata = [] if key is None else [("authorization", f"Bearer {key}")]
    with pytest.raises(grpc.RpcError) as caught:
        list(pb_grpc.GatewayStub(gateway.channel()).Generate(
            pb.GenerateRequest(text="x"), metadata=metadata, timeout=10))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert message in caught.value.details() and "--api-key" in caught.value.details()
    assert httpx.get(f"{gateway.http_url}/health").status_code == 200, "health stays open"


def test_health_and_metrics(stack, client):
    _, gateway = stack
    client.completions.create(model=MODEL, prompt="count me", max_tokens=3, **GREEDY)
    health = httpx.get(f"{gateway.http_url}/health")
    assert health.status_code == 200 and health.json()["models"] == [MODEL]
    text = httpx.get(f"{gateway.http_url}/metrics").text
    for name in (f'pagedserve_gateway_requests_total{{api="http",model_name="{MODEL}",'
                 'outcome="success"}',
                 "pagedserve_gateway_time_to_first_token_seconds_bucket",
                 "pagedserve_gateway_time_per_output_token_seconds_bucket",
                 "pagedserve_gateway_prompt_tokens_total", "pagedserve_allocator_up 1.0",
                 "pagedserve_kv_usage_ratio{executor=", "pagedserve_prefix_cache_hit_rate{",
                 "pagedserve_executor_preemptions_total{", "pagedserve_executor_allocator_stalls",
                 "pagedserve_gateway_requests_running"):
        assert name in text, name


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(stack):
    allocator, gateway = stack
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{gateway.http_url}/v1/completions",
                         headers={"authorization": f"Bearer {KEY}"},
                         json={"model": MODEL, "prompt": "go on", "max_tokens": 3000,
                               "stream": True, "ignore_eos": True}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            wait_for(lambda: used_blocks(allocator) > 0)
        # Leaving the block closes the connection without reading the rest.
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout


def test_a_client_that_gives_up_on_a_whole_response_has_it_cancelled(stack):
    """Not streaming: the gateway notices the disconnect while it collects, cancels the
    generation (counted as cancelled, not run to its end) and the blocks are freed."""
    allocator, gateway = stack

    def cancelled() -> float:
        text = httpx.get(f"{gateway.http_url}/metrics").text
        line = next((line for line in text.splitlines() if line.startswith(
            f'pagedserve_gateway_requests_total{{api="http",model_name="{MODEL}",'
            'outcome="cancelled"}')), None)
        return float(line.split()[-1]) if line else 0.0

    before = cancelled()
    with httpx.Client(timeout=httpx.Timeout(60, read=2.0)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"{gateway.http_url}/v1/completions",
                      headers={"authorization": f"Bearer {KEY}"},
                      json={"model": MODEL, "prompt": "go on", "max_tokens": 3000,
                            "ignore_eos": True})
    wait_for(lambda: cancelled() == before + 1)
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout


def test_one_tenants_prefix_cache_is_invisible_to_another(stack):
    """Each API key is a tenant: a prompt another key's requests cached counts no cached
    tokens, even under the same cache_salt; a tenant's own repeat does, on HTTP and gRPC."""
    _, gateway = stack
    prompt = "a long shared system prompt that fills more than one block " * 3

    def cached(key: str, salt: str = "") -> int:
        with openai.OpenAI(base_url=f"{gateway.http_url}/v1", api_key=key, max_retries=0,
                           timeout=60) as client:
            usage = client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
                extra_body={"cache_salt": salt} if salt else None).usage
        return usage.prompt_tokens_details.cached_tokens

    assert cached(KEY, salt="team") == 0
    assert cached(KEY, salt="team") > 0                 # its own repeat hits
    assert cached("other-key", salt="team") == 0        # same salt, other tenant: nothing
    assert cached("other-key") == 0
    assert cached("other-key") > 0
    stub = pb_grpc.GatewayStub(gateway.channel())
    last = list(stub.Generate(pb.GenerateRequest(text=prompt, sampling=pb.SamplingOptions(
        temperature=0, max_tokens=2)), timeout=60,
        metadata=[("authorization", "Bearer other-key")]))[-1]
    assert last.usage.cached_tokens > 0                 # the same tenant through gRPC


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client):
    """vLLM's stream_options.continuous_usage_stats, which guidellm sends."""
    chunks = list(client.completions.create(
        model=MODEL, prompt="Hello, HTTP", max_tokens=5, stream=True, **GREEDY,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [chunk.usage.completion_tokens for chunk in chunks if chunk.choices]
    assert counts == sorted(counts) and counts[-1] == 5
    assert all(chunk.usage.prompt_tokens == 11 for chunk in chunks)
    assert chunks[-1].usage.total_tokens == 16 and not chunks[-1].choices
    with pytest.raises(openai.BadRequestError, match="stream_options.every_chunk is not"):
        client.completions.create(model=MODEL, prompt="x", stream=True,
                                  stream_options={"every_chunk": True})
