"""Structured output, logit_bias and allowed_token_ids over the OpenAI-compatible HTTP API,
driven by the official `openai` package against real allocator, executor and gateway processes.
The embedded model is random: whatever parses, the grammar made parse."""
from __future__ import annotations

import json
import re

import grpc
import httpx
import openai
import pytest

from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc

MODEL = "pagedserve-embedded-llama"
SAMPLED = dict(temperature=1.0, seed=11, max_tokens=300)
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "population": {"type": "integer", "minimum": 0, "maximum": 10**9},
        "capital": {"type": "boolean"},
        "climate": {"enum": ["dry", "wet", "mild"]},
        "districts": {"type": "array", "items": {"type": "string", "maxLength": 4},
                      "maxItems": 3},
        "mayor": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 6}]},
    },
    "required": ["city", "population", "capital", "climate", "mayor"],
    "additionalProperties": False,
}


def check_city(value) -> None:
    """CITY, checked by hand: no schema validator is a dependency."""
    assert isinstance(value, dict) and set(value) <= set(CITY["properties"])
    assert set(CITY["required"]) <= set(value)
    assert isinstance(value["city"], str) and len(value["city"]) <= 10
    assert type(value["population"]) is int and 0 <= value["population"] <= 10**9
    assert type(value["capital"]) is bool and value["climate"] in ("dry", "wet", "mild")
    assert all(isinstance(d, str) and len(d) <= 4 for d in value.get("districts", []))
    assert len(value.get("districts", [])) <= 3
    assert value["mayor"] is None or (isinstance(value["mayor"], str)
                                      and len(value["mayor"]) <= 6)


@pytest.fixture
def client(stack) -> openai.OpenAI:
    _, gateway = stack
    with openai.OpenAI(base_url=f"{gateway.http_url}/v1", api_key="none", max_retries=0,
                       timeout=120) as client:
        yield client


def chat(client, **fields):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a city."}], **fields)


def test_response_format_json_schema_parses_and_validates_for_n_choices(client):
    response = chat(client, n=2, response_format={"type": "json_schema", "json_schema": {
        "name": "city", "schema": CITY, "strict": True}}, **SAMPLED)
    for choice in response.choices:
        assert choice.finish_reason == "stop"
        check_city(json.loads(choice.message.content))
    assert response.choices[0].message.content != response.choices[1].message.content


def test_streamed_json_schema_is_whole_when_joined(client):
    chunks = list(chat(client, stream=True, extra_body={"guided_json": json.dumps(CITY)},
                       **SAMPLED))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    check_city(json.loads(text))


def test_json_object_is_a_json_object(client):
    # The random model rarely closes a string or an object, and "any object" bounds neither:
    # biases on '"' and '}' let most choices end within max_tokens. How they end is the
    # grammar's doing.
    response = chat(client, n=4, response_format={"type": "json_object"},
                    logit_bias={str(ord('"')): 6, str(ord("}")): 9.5}, **SAMPLED)
    finished = [c for c in response.choices if c.finish_reason == "stop"]
    assert len(finished) >= 2
    for choice in finished:
        assert isinstance(json.loads(choice.message.content), dict)


def test_guided_regex_choice_and_grammar_match_on_completions(client):
    regex = r"[0-9]{2,4}-[a-z]{3}"
    grammar = 'root ::= "SELECT " col " FROM " [a-z]{1,5}\ncol ::= "id" | "name"'
    for extra, check in [
            ({"guided_regex": regex}, lambda text: re.fullmatch(regex, text)),
            ({"guided_choice": ["red", "green", "blue"]},
             lambda text: text in ("red", "green", "blue")),
            ({"structured_outputs": {"choice": ["up", "down"]}}, lambda text: text in ("up",
                                                                                      "down")),
            ({"guided_grammar": grammar},
             lambda text: re.fullmatch(r"SELECT (id|name) FROM [a-z]{1,5}", text)),
            ({"structured_outputs": {"regex": "(ab)+c"}},
             lambda text: re.fullmatch("(ab)+c", text))]:
        response = client.completions.create(model=MODEL, prompt="Pick: ", extra_body=extra,
                                             **SAMPLED)
        (choice,) = response.choices
        assert choice.finish_reason == "stop" and check(choice.text), (extra, choice.text)


def test_logit_bias_plus_100_makes_greedy_output_that_token(client):
    token = ord("Z")   # the embedded model's ids are the bytes
    response = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6,
                                         temperature=0, logit_bias={str(token): 100})
    assert response.choices[0].text == "ZZZZZZ"


def test_allowed_token_ids_restrict_the_vocabulary(client):
    response = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, seed=3,
                                         temperature=1.0, extra_body={
                                             "allowed_token_ids": [ord("x"), ord("y")],
                                             "ignore_eos": True})
    assert set(response.choices[0].text) <= {"x", "y"} and len(response.choices[0].text) == 20


@pytest.mark.parametrize("extra, words", [
    ({"guided_json": {"type": "strin"}}, "json_schema is invalid"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}}, "json_schema is invalid"),
    ({"guided_regex": "a(b"}, "regex is invalid"),
    ({"guided_grammar": "root ::= missing"}, "grammar is invalid"),
    ({"guided_json": "{not json"}, "guided_json is not valid JSON"),
    ({"guided_choice": []}, "guided_choice must hold at least one choice"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex and guided_choice each "
                                                     "constrain the output"),
    ({"structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": False}},
     "structured_outputs.disable_any_whitespace"),
    ({"logit_bias": {"5": 101}}, "logit_bias values must be in"),
    ({"logit_bias": {"five": 1}}, "logit_bias keys must be token ids"),
    ({"allowed_token_ids": [10**7]}, "allowed_token_ids must be in"),
    ({"guided_json": {"type": "object"}, "use_beam_search": True, "n": 2, "temperature": 0},
     "structured output is not supported with beam search"),
])
def test_bad_constraints_get_a_400_naming_the_field(stack, extra, words):
    _, gateway = stack
    response = httpx.post(f"{gateway.http_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "Hi", "max_tokens": 4, **extra})
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]


def test_grpc_gateway_api_takes_the_same_constraints(stack):
    _, gateway = stack
    stub = pb_grpc.GatewayStub(gateway.channel())
    sampling = pb.SamplingOptions(
        temperature=1.0, seed=5, max_tokens=300, logit_bias={ord("b"): 100.0},
        structured=pb.StructuredOutput(kind=pb.STRUCTURED_OUTPUT_KIND_CHOICE,
                                       spec='["alpha", "beta"]'))
    text = "".join(c.text for r in stub.Generate(pb.GenerateRequest(
        text="Pick: ", sampling=sampling), timeout=60) for c in r.choices)
    # The bias makes "b" the first token, the grammar the rest.
    assert text == "beta"
    with pytest.raises(grpc.RpcError) as refused:
        list(stub.Generate(pb.GenerateRequest(text="Hi", sampling=pb.SamplingOptions(
            structured=pb.StructuredOutput(kind=pb.STRUCTURED_OUTPUT_KIND_REGEX,
                                           spec="a(b"))), timeout=60))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "regex is invalid" in refused.value.details()
