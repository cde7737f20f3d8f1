"""OpenAI request bodies → GenerationRequest, GenerationEvents → OpenAI response bodies, and
domain errors → HTTP errors: the pure translation behind the gateway's HTTP API."""
from __future__ import annotations

import json

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.choice_stream import ChoiceDelta, TokenLogprob, TopLogprob
from gateway.generation import GenerationEvent, Usage
from gateway.generation_request import ChatMessage
from gateway.openai_http.errors import error_body, http_status_of
from gateway.openai_http.requests import (OpenAIParamError, param_of, parse_chat_request,
                                          parse_completion_request)
from gateway.openai_http.responses import OpenAIResponder, error_of
from pagedserve.common import errors
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.sampling_params import InvalidSamplingParams, SamplingParams
from pagedserve.protocol.structured_output import StructuredOutput

USER = [{"role": "user", "content": "hi"}]


def completion(**fields):
    return parse_completion_request({"prompt": "hello", **fields})


def chat(**fields):
    return parse_chat_request({"messages": USER, **fields})


def refusal(parse, body) -> OpenAIParamError:
    with pytest.raises(OpenAIParamError) as raised:
        parse(body)
    return raised.value


# -- requests: prompts and messages --------------------------------------------------------------

@pytest.mark.parametrize("prompt, text, token_ids", [
    ("hello", "hello", None),
    (["hello"], "hello", None),
    ([1, 2, 3], None, (1, 2, 3)),
    ([[4, 5]], None, (4, 5)),
])
def test_each_prompt_form_becomes_text_or_token_ids(prompt, text, token_ids) -> None:
    generation = parse_completion_request({"prompt": prompt}).generation
    assert (generation.text, generation.token_ids, generation.chat) == (text, token_ids, None)


@pytest.mark.parametrize("prompt, phrase", [
    (["a"] * 257, "at most 256 prompts in one request, got 257"),
    (["a", ""], "prompt[1] must not be empty"),
    ("", "prompt must not be empty"),
    ([], "prompt must not be empty"),
    ([""], "prompt[0] must not be empty"),
    ([[]], "prompt[0] must not be empty"),
    ([1, "a"], "found a string among the token ids"),
    ([["a"]], "found a string among the token ids"),
    ([1, True], "found a boolean among the token ids"),
    (7, "prompt must be a string or an array, got an integer"),
    (None, "prompt is required"),
])
def test_bad_prompts_are_refused_naming_prompt(prompt, phrase) -> None:
    error = refusal(parse_completion_request, {"prompt": prompt})
    assert error.param == "prompt"
    assert phrase in str(error)


def test_a_batch_of_prompts_is_one_generation_per_prompt_with_the_same_fields() -> None:
    request = completion(prompt=["a", [5, 6], "c"], max_tokens=3, n=2, temperature=0.5)
    assert [(g.text, g.token_ids) for g in request.generations] == [
        ("a", None), (None, (5, 6)), ("c", None)]
    assert {(g.max_tokens, g.sampling) for g in request.generations} == {
        (3, request.generation.sampling)}
    assert request.generation.sampling.n == 2


def test_chat_content_parts_are_joined_and_developer_reads_as_system() -> None:
    request = parse_chat_request({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "one "},
                                     {"type": "text", "text": "two"}], "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "42", "tool_call_id": "x"}]})
    assert request.generation.chat == (ChatMessage("system", "be brief"),
                                       ChatMessage("user", "one two", name="ann"),
                                       ChatMessage("assistant", ""),
                                       ChatMessage("tool", "42", tool_call_id="x"))
    assert request.generation.add_generation_prompt is True
    assert request.chat is True


@pytest.mark.parametrize("messages, param, phrase", [
    ([], "messages", "at least one message"),
    ("hi", "messages", "messages must be an array, got a string"),
    (["hi"], "messages[0]", "messages[0] must be an object, got a string"),
    ([{"content": "x"}], "messages[0].role", "messages[0].role is required"),
    ([{"role": "robot", "content": "x"}], "messages[0].role", "must be one of system, user"),
    ([{"role": "user", "content": None}], "messages[0].content", "only assistant messages"),
    ([{"role": "user", "content": 3}], "messages[0].content", "a string or an array"),
    (USER + [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
     "messages[1].content[0]", "messages[1].content[0]: only text parts are supported"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}],
     "messages[0].content[0].text", "must be a string, got an integer"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}],
     "messages[0].tool_calls[0].function", "messages[0].tool_calls[0].function is required"),
    ([{"role": "user", "content": "x", "function_call": {"name": "f"}}],
     "messages[0].function_call", "deprecated function calls are not supported"),
])
def test_bad_messages_are_refused_naming_the_message(messages, param, phrase) -> None:
    error = refusal(parse_chat_request, {"messages": messages})
    assert error.param == param
    assert phrase in str(error)


def test_body_that_is_not_an_object_is_refused_without_a_param() -> None:
    error = refusal(parse_completion_request, ["hello"])
    assert error.param is None
    assert "must be a JSON object, got an array" in str(error)


# -- requests: defaults and sampling -------------------------------------------------------------

def test_completion_defaults() -> None:
    request = completion()
    assert request.generation.max_tokens == 16
    assert request.generation.sampling == SamplingParams()
    assert request.generation.model == ""
    assert request.generation.stop == ()
    assert request.generation.keep_special_tokens is False
    assert (request.stream, request.include_usage, request.chat, request.logprobs) == (
        False, False, False, False)


def test_chat_defaults_to_no_max_tokens() -> None:
    request = chat()
    assert request.generation.max_tokens is None
    assert request.generation.sampling == SamplingParams()


def test_null_fields_read_as_not_given() -> None:
    request = completion(max_tokens=None, temperature=None, n=None, stop=None, seed=None)
    assert request.generation.max_tokens == 16
    assert request.generation.sampling == SamplingParams()


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat(max_tokens=5, max_completion_tokens=7).generation.max_tokens == 7
    assert chat(max_tokens=5).generation.max_tokens == 5


@pytest.mark.parametrize("parse, name", [(completion, "max_tokens"), (chat, "max_tokens"),
                                         (chat, "max_completion_tokens")])
def test_max_tokens_below_one_is_refused(parse, name) -> None:
    with pytest.raises(OpenAIParamError, match=f"{name} must be >= 1, or 0 to score or echo "
                       "the prompt") as raised:
        parse(**{name: -1})
    assert raised.value.param == name
    # 0 parses, and is refused by the request's check unless the prompt is scored or echoed.
    with pytest.raises(InvalidArgument, match="max_tokens must be >= 1, or 0"):
        parse(**{name: 0}).generation.check()


def test_max_tokens_0_scores_or_echoes_the_prompt() -> None:
    echoed = completion(max_tokens=0, echo=True, logprobs=2)
    assert echoed.echo and echoed.generation.echo
    assert echoed.generation.sampling.prompt_logprobs == 2   # echo with logprobs scores it
    echoed.generation.check()
    scored = completion(max_tokens=0, prompt_logprobs=0)
    assert not scored.echo and scored.prompt_logprobs
    scored.generation.check()


def test_sampling_fields_and_extensions_map_to_sampling_params() -> None:
    request = completion(model="m", n=3, temperature=0, top_p=0.9, presence_penalty=0.5,
                         frequency_penalty=-1, seed=7, top_k=-1, min_p=0.1,
                         repetition_penalty=1.2, ignore_eos=True, stop_token_ids=[5, 6],
                         stop=["\n", "END"], cache_salt="s", skip_special_tokens=False,
                         user="u", metadata={"a": "b"})
    assert request.generation.sampling == SamplingParams(
        n=3, temperature=0.0, top_p=0.9, presence_penalty=0.5, frequency_penalty=-1.0, seed=7,
        top_k=0, min_p=0.1, repetition_penalty=1.2, ignore_eos=True, stop_token_ids=(5, 6))
    generation = request.generation
    assert (generation.model, generation.stop, generation.cache_salt) == ("m", ("\n", "END"), "s")
    assert generation.keep_special_tokens is True
    assert completion(top_k=40).generation.sampling.top_k == 40
    assert completion(stop="x").generation.stop == ("x",)


@pytest.mark.parametrize("name, value, phrase", [
    ("temperature", "hot", "temperature must be a number, got a string"),
    ("temperature", True, "temperature must be a number, got a boolean"),
    ("top_p", False, "top_p must be a number, got a boolean"),
    ("n", True, "n must be an integer, got a boolean"),
    ("n", 2.0, "n must be an integer, got a number"),
    ("max_tokens", True, "max_tokens must be an integer, got a boolean"),
    ("seed", "1", "seed must be an integer, got a string"),
    ("top_k", 1.5, "top_k must be an integer, got a number"),
    ("ignore_eos", 1, "ignore_eos must be a boolean, got an integer"),
    ("stream", "yes", "stream must be a boolean, got a string"),
    ("model", 3, "model must be a string, got an integer"),
    ("stop", 3, "stop must be a string or an array, got an integer"),
    ("stop_token_ids", 3, "stop_token_ids must be an array, got an integer"),
    ("logprobs", True, "logprobs must be an integer, got a boolean"),
])
def test_wrong_json_types_are_refused_naming_the_field(name, value, phrase) -> None:
    error = refusal(parse_completion_request, {"prompt": "p", name: value})
    assert error.param == name
    assert phrase in str(error)


@pytest.mark.parametrize("name, value, param", [
    ("stop", ["a", 1], "stop[1]"),
    ("stop_token_ids", [1, True], "stop_token_ids[1]"),
])
def test_wrong_types_inside_arrays_name_the_entry(name, value, param) -> None:
    assert refusal(parse_completion_request, {"prompt": "p", name: value}).param == param


def test_ranges_are_left_to_sampling_params_validate() -> None:
    sampling = completion(temperature=float("nan"), top_p=1.5).generation.sampling
    with pytest.raises(InvalidSamplingParams, match="temperature") as raised:
        sampling.validate(vocab_size=100)
    assert param_of(str(raised.value)) == "temperature"


@pytest.mark.parametrize("message, param", [
    ("top_p must be in (0, 1], got 1.5", "top_p"),
    ("n must be between 1 and 128, got 200", "n"),
    ("stop_token_ids must be in [0, 100), got 100", "stop_token_ids"),
    ("messages[2].role must be one of system, user, assistant, tool; got 'x'",
     "messages[2].role"),
    ("stop[0] must be 1 to 64 characters, got 0", "stop[0]"),
    ("prompt token_ids[3] = 999 is outside m's vocabulary [0, 100)", "prompt"),
    ("model 'x' is not served here; served: m", "model"),
    ("the prompt has 9 tokens; m's context window ...", None),
    ("no executor is ready yet; retry shortly", None),
    ("", None),
])
def test_param_of_finds_the_leading_field_of_a_core_message(message, param) -> None:
    assert param_of(message) == param


# -- requests: logprobs and streaming ------------------------------------------------------------

def test_completion_logprobs_count_alternatives() -> None:
    assert completion(logprobs=3).generation.sampling.logprobs == 3
    assert completion(logprobs=3).logprobs is True
    assert completion(logprobs=0).generation.sampling.logprobs == 0
    assert completion().generation.sampling.logprobs is None
    assert completion().logprobs is False


def test_chat_logprobs_flag_and_top_logprobs() -> None:
    assert chat(logprobs=True, top_logprobs=5).generation.sampling.logprobs == 5
    assert chat(logprobs=True).generation.sampling.logprobs == 0
    assert chat(logprobs=True).logprobs is True
    assert chat(logprobs=False).generation.sampling.logprobs is None
    assert chat().logprobs is False


@pytest.mark.parametrize("fields, phrase", [
    ({"top_logprobs": 2}, "top_logprobs requires logprobs to be true"),
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs requires logprobs to be true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be between 0 and 20, got 21"),
])
def test_bad_top_logprobs_are_refused(fields, phrase) -> None:
    error = refusal(parse_chat_request, {"messages": USER, **fields})
    assert error.param == "top_logprobs"
    assert phrase in str(error)


def test_chat_logprobs_must_be_a_boolean() -> None:
    error = refusal(parse_chat_request, {"messages": USER, "logprobs": 3})
    assert (error.param, str(error)) == ("logprobs", "logprobs must be a boolean, got an integer")


def test_stream_options_carry_include_usage() -> None:
    request = chat(stream=True, stream_options={"include_usage": True})
    assert (request.stream, request.include_usage) == (True, True)
    assert completion(stream=True, stream_options={}).include_usage is False
    assert completion(stream=True).include_usage is False


@pytest.mark.parametrize("fields", [{"stream_options": {"include_usage": True}},
                                    {"stream": False, "stream_options": {}}])
def test_stream_options_without_stream_are_refused(fields) -> None:
    error = refusal(parse_completion_request, {"prompt": "p", **fields})
    assert error.param == "stream_options"
    assert "only allowed when stream is true" in str(error)


def test_include_usage_must_be_a_boolean() -> None:
    error = refusal(parse_chat_request, {"messages": USER, "stream": True,
                                         "stream_options": {"include_usage": "yes"}})
    assert error.param == "stream_options.include_usage"


# -- requests: unsupported features --------------------------------------------------------------

@pytest.mark.parametrize("fields, param, phrase", [
    ({"suffix": "end"}, "suffix", "suffix is not supported"),
    ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend",
     "guided_decoding_backend is not supported: structured output has one grammar engine"),
])
def test_unsupported_completion_features_are_refused(fields, param, phrase) -> None:
    error = refusal(parse_completion_request, {"prompt": "p", **fields})
    assert error.param == param
    assert phrase in str(error)


def test_harmless_values_of_unsupported_completion_features_are_accepted() -> None:
    request = completion(echo=False, suffix="", logit_bias={})
    assert request.generation.sampling.n == 1


def test_best_of_reaches_the_sampling_params() -> None:
    sampling = completion(best_of=3, n=2).generation.sampling
    assert (sampling.n, sampling.best_of, sampling.num_sequences) == (2, 3, 3)
    assert completion(best_of=1).generation.sampling.num_sequences == 1


@pytest.mark.parametrize("fields, param, phrase", [
    ({"tool_choice": "auto"}, "tool_choice", 'tool_choice "auto" needs tools'),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
     "needs tools: give at least one in tools"),
    ({"response_format": {"type": "xml"}}, "response_format.type",
     'response_format.type must be "text", "json_object" or "json_schema"'),
    ({"functions": [{"name": "f"}]}, "functions", "functions is not supported"),
    ({"logit_bias": {"1": 5}, "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice",
     "guided_regex and guided_choice each constrain the output"),
])
def test_unsupported_chat_features_are_refused(fields, param, phrase) -> None:
    error = refusal(parse_chat_request, {"messages": USER, **fields})
    assert error.param == param
    assert phrase in str(error)


@pytest.mark.parametrize("parse, fields, param", [
    (completion, {"max_token": 4}, "max_token"),
    (completion, {"messages": USER}, "messages"),
    (chat, {"prompt": "p"}, "prompt"),
    (chat, {"vendor_extra": 1}, "vendor_extra"),
])
def test_a_key_neither_openai_nor_vllm_defines_here_is_refused(parse, fields, param) -> None:
    with pytest.raises(OpenAIParamError, match=f"Unrecognized request argument supplied: "
                                               f"{param}") as raised:
        parse(**fields)
    assert raised.value.param == param


@pytest.mark.parametrize("fields, param", [
    ({"min_tokens": 8}, "min_tokens"),
    ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),
    ({"bad_words": ["x"]}, "bad_words"),
    ({"truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
])
def test_vllm_fields_that_are_not_implemented_are_refused_not_ignored(fields, param) -> None:
    for parse in (completion, chat):
        with pytest.raises(OpenAIParamError, match=f"{param} is not supported") as raised:
            parse(**fields)
        assert raised.value.param == param


def test_chat_only_vllm_fields_are_refused_naming_them() -> None:
    for fields in ({"continue_final_message": True}, {"chat_template_kwargs": {"x": 1}},
                   {"echo": True}):
        (param,) = fields
        with pytest.raises(OpenAIParamError, match=f"{param} is not supported"):
            chat(**fields)
    # Their neutral values ask for nothing and pass.
    chat(continue_final_message=False, chat_template_kwargs={}, echo=False, min_tokens=0,
         include_stop_str_in_output=False, bad_words=[], priority=0)


def test_constraint_fields_reach_the_sampling_params() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for fields, kind, spec in [
            ({"response_format": {"type": "json_schema", "json_schema": {
                "name": "s", "schema": schema}}}, "json_schema", json.dumps(schema)),
            ({"guided_json": json.dumps(schema)}, "json_schema", json.dumps(schema)),
            ({"structured_outputs": {"json_object": True}}, "json_object", ""),
            ({"guided_choice": ["a", "b"]}, "choice", '["a", "b"]'),
            ({"structured_outputs": {"regex": "a+"}}, "regex", "a+"),
            ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"')]:
        sampling = chat(**fields).generation.sampling
        assert sampling.structured == StructuredOutput(kind, spec), fields
    sampling = completion(logit_bias={"7": -100, "3": 2.5},
                          allowed_token_ids=[4, 5]).generation.sampling
    assert sampling.logit_bias == ((3, 2.5), (7, -100.0))
    assert sampling.allowed_token_ids == (4, 5)
    assert completion(response_format={"type": "text"}).generation.sampling.structured is None


def test_harmless_values_of_unsupported_chat_features_and_ignored_fields_are_accepted() -> None:
    request = chat(tools=[], tool_choice="none", response_format={"type": "text"},
                   functions=None, parallel_tool_calls=True, service_tier="auto", user="u",
                   add_generation_prompt=False)
    assert request.generation.add_generation_prompt is False


# -- responses -----------------------------------------------------------------------------------

def token(text: str, logprob: float, *top: tuple[str, float]) -> TokenLogprob:
    return TokenLogprob(ord(text[0]), text, logprob,
                        tuple(TopLogprob(ord(t[0]), t, lp) for t, lp in top))


USAGE = Usage(prompt_tokens=5, completion_tokens=4, cached_tokens=2)
USAGE_OBJECT = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 2}}


def events() -> list[GenerationEvent]:
    """Two choices: 0 says "Hello world" and stops, 1 says "Hi" and hits the length limit.
    Choice 1's "H" is held back at first (as a partial character would be): its text comes with
    the "i", and both start at 0 (choice_stream.py counts the offsets)."""
    return [
        GenerationEvent([ChoiceDelta(0, "Hel", [1], [token("Hel", -0.5, ("Hel", -0.5),
                                                            ("Hi", -1.0))], text_offsets=[0]),
                         ChoiceDelta(1, "", [2], [token("H", -0.25)], text_offsets=[0])],
                        model="m", request_id="gw-1"),
        GenerationEvent([ChoiceDelta(0, "lo world", [3, 4], [token("lo", -0.125),
                                                              token(" world", -1.5)],
                                     text_offsets=[3, 5]),
                         ChoiceDelta(1, "Hi", [5], [token("i", -0.75)], "length",
                                     text_offsets=[0])]),
        GenerationEvent([ChoiceDelta(0, "", [], [], "stop")], usage=USAGE),
    ]


def responder(request) -> OpenAIResponder:
    return OpenAIResponder(request, "id-1", 1700000000, "m")


def stream(request, events_) -> list[dict]:
    out = responder(request)
    return [chunk for event in events_ for chunk in out.chunks(event)]


def whole(request, events_) -> dict:
    out = responder(request)
    for event in events_:
        out.add(event)
    return out.response()


def test_streamed_chat_opens_each_choice_with_the_role_and_ends_with_usage() -> None:
    request = chat(stream=True, stream_options={"include_usage": True})
    chunks = stream(request, events())
    head = {"id": "id-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
    assert all({key: chunk[key] for key in head} == head for chunk in chunks)
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"],
             c["choices"][0]["finish_reason"]) if c["choices"] else c["usage"]
            for c in chunks] == [
        (0, {"role": "assistant", "content": ""}, None),
        (0, {"content": "Hel"}, None),
        (1, {"role": "assistant", "content": ""}, None),
        # Choice 1's first token brought no text and logprobs are not asked for: no chunk.
        (0, {"content": "lo world"}, None),
        (1, {"content": "Hi"}, "length"),
        (0, {}, "stop"),
        USAGE_OBJECT,
    ]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert all(choice["logprobs"] is None for chunk in chunks for choice in chunk["choices"])


def test_streamed_chat_logprobs_ride_with_their_tokens() -> None:
    chunks = stream(chat(stream=True, logprobs=True, top_logprobs=2), events())
    by_choice = [(c["choices"][0]["index"], c["choices"][0]["delta"], c["choices"][0]["logprobs"])
                 for c in chunks]
    assert "usage" not in chunks[0]
    assert by_choice[3] == (1, {}, {"content": [
        {"token": "H", "logprob": -0.25, "bytes": [72], "top_logprobs": []}]})
    assert by_choice[1][2] == {"content": [
        {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108],
         "top_logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
                          {"token": "Hi", "logprob": -1.0, "bytes": [72, 105]}]}]}
    assert by_choice[-1] == (0, {}, None)      # the finish carries no token


def test_no_chunk_for_a_delta_without_text_logprobs_or_finish() -> None:
    out = responder(completion(stream=True))
    assert out.chunks(GenerationEvent([ChoiceDelta(0, "", [7])])) == []
    chat_out = responder(chat(stream=True))
    assert len(chat_out.chunks(GenerationEvent([ChoiceDelta(0, "", [7])]))) == 1   # the role
    assert chat_out.chunks(GenerationEvent([ChoiceDelta(0, "", [8])])) == []


def test_streamed_completion_chunks_carry_text_and_continuing_offsets() -> None:
    chunks = stream(completion(stream=True, logprobs=1), events())
    assert [{key: chunk[key] for key in ("id", "object", "created", "model")}
            for chunk in chunks] == [{"id": "id-1", "object": "text_completion",
                                      "created": 1700000000, "model": "m"}] * 5
    assert [(c["choices"][0]["index"], c["choices"][0]["text"], c["choices"][0]["finish_reason"])
            for c in chunks] == [(0, "Hel", None), (1, "", None), (0, "lo world", None),
                                 (1, "Hi", "length"), (0, "", "stop")]
    assert chunks[0]["choices"][0]["logprobs"] == {
        "tokens": ["Hel"], "token_logprobs": [-0.5], "top_logprobs": [{"Hel": -0.5, "Hi": -1.0}],
        "text_offset": [0]}
    # Choice 0 sent "Hel" before: its next tokens start at 3, then 3 + len("lo").
    assert chunks[2]["choices"][0]["logprobs"] == {
        "tokens": ["lo", " world"], "token_logprobs": [-0.125, -1.5],
        "top_logprobs": [{"lo": -0.125}, {" world": -1.5}], "text_offset": [3, 5]}
    # Choice 1's first token came with no text, so "i" starts at 0 too.
    assert chunks[3]["choices"][0]["logprobs"]["text_offset"] == [0]
    assert chunks[4]["choices"][0]["logprobs"] is None
    assert all("usage" not in chunk for chunk in chunks)


def test_streamed_completion_with_usage_ends_with_a_usage_chunk() -> None:
    chunks = stream(completion(stream=True, stream_options={"include_usage": True}), events())
    assert chunks[-1] == {"id": "id-1", "object": "text_completion", "created": 1700000000,
                          "model": "m", "choices": [], "usage": USAGE_OBJECT}
    # Choice 1's first delta has neither text nor (requested) logprobs: no chunk for it.
    assert [chunk["usage"] for chunk in chunks[:-1]] == [None] * 4


def test_whole_completion_body() -> None:
    body = whole(completion(logprobs=1), events())
    assert body == {
        "id": "id-1", "object": "text_completion", "created": 1700000000, "model": "m",
        "choices": [
            {"index": 0, "text": "Hello world", "finish_reason": "stop", "logprobs": {
                "tokens": ["Hel", "lo", " world"], "token_logprobs": [-0.5, -0.125, -1.5],
                "top_logprobs": [{"Hel": -0.5, "Hi": -1.0}, {"lo": -0.125}, {" world": -1.5}],
                "text_offset": [0, 3, 5]}},
            {"index": 1, "text": "Hi", "finish_reason": "length", "logprobs": {
                "tokens": ["H", "i"], "token_logprobs": [-0.25, -0.75],
                "top_logprobs": [{"H": -0.25}, {"i": -0.75}], "text_offset": [0, 0]}}],
        "usage": USAGE_OBJECT}


def test_whole_chat_body() -> None:
    body = whole(chat(), events())
    assert body == {
        "id": "id-1", "object": "chat.completion", "created": 1700000000, "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hello world"},
             "logprobs": None, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "Hi"},
             "logprobs": None, "finish_reason": "length"}],
        "usage": USAGE_OBJECT}
    with_logprobs = whole(chat(logprobs=True), events())
    assert [token["token"] for token in with_logprobs["choices"][0]["logprobs"]["content"]] == [
        "Hel", "lo", " world"]


@pytest.mark.parametrize("parse", [completion, chat])
def test_whole_body_equals_the_streamed_chunks_joined(parse) -> None:
    request = parse(logprobs=1) if parse is completion else parse(logprobs=True)
    body = whole(request, events())
    chunks = stream(request, events())
    for choice in body["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == choice["index"]]
        if request.chat:
            text = "".join(c["delta"].get("content", "") for c in mine)
            assert text == choice["message"]["content"]
            streamed = [t for c in mine if c["logprobs"] for t in c["logprobs"]["content"]]
            assert streamed == choice["logprobs"]["content"]
        else:
            assert "".join(c["text"] for c in mine) == choice["text"]
            assert [o for c in mine if c["logprobs"] for o in c["logprobs"]["text_offset"]] == (
                choice["logprobs"]["text_offset"])
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == [
            choice["finish_reason"]]


def test_cancelled_reads_as_abort() -> None:
    cancelled = [GenerationEvent([ChoiceDelta(0, "a", [1])]),
                 GenerationEvent([ChoiceDelta(0, finish_reason="cancelled")], usage=USAGE)]
    assert whole(completion(), cancelled)["choices"][0]["finish_reason"] == "abort"
    assert stream(chat(stream=True), cancelled)[-1]["choices"][0] == {
        "index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort"}


def test_failed_choices_are_left_to_error_of() -> None:
    failed = GenerationEvent([ChoiceDelta(0, finish_reason="error", error="executor failed: x"),
                              ChoiceDelta(1, "ok", [1], finish_reason="stop")], usage=USAGE)
    assert error_of(failed) == "executor failed: x"
    assert error_of(GenerationEvent([ChoiceDelta(0, "a", [1])])) is None
    assert error_of(GenerationEvent([ChoiceDelta(0, finish_reason="error")])) == (
        "generation failed")
    chunks = stream(completion(stream=True), [failed])
    assert [c["choices"][0]["index"] for c in chunks] == [1]
    assert [c["index"] for c in whole(chat(), [failed])["choices"]] == [1]


def test_negative_infinity_logprobs_become_finite() -> None:
    event = GenerationEvent([ChoiceDelta(0, "a", [1], [token("a", float("-inf"),
                                                             ("b", float("-inf")))], "stop")])
    body = whole(completion(logprobs=1), [event])
    assert body["choices"][0]["logprobs"]["token_logprobs"] == [-9999.0]
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [{"b": -9999.0}]


def test_bodies_and_chunks_validate_as_the_openai_package_types() -> None:
    openai.types.Completion.model_validate(whole(completion(logprobs=2), events()))
    ChatCompletion.model_validate(whole(chat(logprobs=True, top_logprobs=2), events()))
    for chunk in stream(chat(stream=True, logprobs=True, stream_options={"include_usage": True}),
                        events()):
        ChatCompletionChunk.model_validate(chunk)
    # openai's CompletionChoice types finish_reason as never null, though streamed chunks carry
    # null until the last one (the SDK builds them without validating): check the finishing ones.
    for chunk in stream(completion(stream=True, logprobs=2), events()):
        if chunk["choices"][0]["finish_reason"] is not None:
            openai.types.Completion.model_validate(chunk)


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("error, status", [
    (OpenAIParamError("bad", "n"), (400, "invalid_request_error", None)),
    (InvalidSamplingParams("top_p must be ..."), (400, "invalid_request_error", None)),
    (errors.InvalidArgument("bad"), (400, "invalid_request_error", None)),
    (errors.FailedPrecondition("stale"), (400, "invalid_request_error", None)),
    (errors.NotFound("no model"), (404, "invalid_request_error", "model_not_found")),
    (errors.Unauthenticated("who"), (401, "authentication_error", "invalid_api_key")),
    (errors.ResourceExhausted("full"), (429, "rate_limit_exceeded", "rate_limit_exceeded")),
    (errors.Unavailable("down"), (503, "service_unavailable", None)),
    (errors.AlreadyExists("dup"), (500, "internal_error", None)),
    (ValueError("bug"), (500, "internal_error", None)),
])
def test_http_status_of_each_error_class(error, status) -> None:
    assert http_status_of(error) == status


def test_error_body_has_openai_shape() -> None:
    assert error_body("n must be an integer", "invalid_request_error", "n") == {
        "error": {"message": "n must be an integer", "type": "invalid_request_error",
                  "param": "n", "code": None}}
