"""Tool calling, the pure parts: reading a choice's text as content and calls
(gateway/tool_calls.py), the request's tool fields (gateway/openai_http/tools.py), the
conversation's calls through the chat template, and the responses built from real token ids of
the embedded model's tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from transformers import AutoTokenizer

from executor_service.model.embedded import EOS_TOKEN_ID, write_embedded_checkpoint
from executor_service.model.tokenizer_files import load_tokenizer_files
from gateway.chat_template import ChatTemplate
from gateway.choice_stream import ChoiceStream
from gateway.generation import GenerationEvent, Usage
from gateway.generation_request import ChatMessage
from gateway.openai_http.json_values import OpenAIParamError
from gateway.openai_http.requests import parse_chat_request
from gateway.openai_http.responses import OpenAIResponder
from gateway.tokenizer import GatewayTokenizer
from gateway.tool_calls import (HermesCallReader, NamedCallReader, RequiredCallsReader, ToolCall,
                                assemble)
from pagedserve.protocol.finish_reason import finish_reason_to_proto
from pagedserve.protocol.structured_output import StructuredOutput

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
TWO_CALLS = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
             '"arguments": {}}\n</tool_call>\n')


def read_all(reader, text: str, piece: int) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments)]) from feeding `text` in pieces of `piece` characters."""
    content, fragments = "", []
    for start in range(0, len(text), piece):
        out = reader.feed(text[start:start + piece])
        content += out.content
        fragments += out.calls
    out = reader.finish()
    content += out.content
    fragments += out.calls
    return content, [(call.name, call.arguments) for call in assemble(fragments)]


# -- reading the text --------------------------------------------------------------------------

@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1000])
def test_complete_blocks_are_calls_and_the_text_before_them_is_content(piece):
    reader = HermesCallReader()
    assert read_all(reader, TWO_CALLS, piece) == (
        "I will check.", [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")])
    assert reader.called


@pytest.mark.parametrize("piece", [1, 4, 1000])
@pytest.mark.parametrize("text", [
    "Plain text, no calls at all.  ",
    "a < b and <tool but not a tag\n",
    'x <tool_call>{"name": "f", "arguments": [1]}</tool_call> y',      # arguments not an object
    "x <tool_call>{not json}</tool_call>",
    'ends inside a block <tool_call>{"name": "f", "argu',
    "ends on a partial tag <tool_ca",
])
def test_text_that_makes_no_call_is_all_content_unchanged(text, piece):
    reader = HermesCallReader()
    assert read_all(reader, text, piece) == (text, [])
    assert not reader.called


@pytest.mark.parametrize("piece", [1, 5, 1000])
def test_a_malformed_block_stays_content_beside_a_parsed_call(piece):
    text = ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>\n'
            "Also: <tool_call>{oops}</tool_call> done")
    assert read_all(HermesCallReader(), text, piece) == (
        "Also: <tool_call>{oops}</tool_call> done", [("f", '{"a": 1}')])


def test_content_is_held_back_only_while_it_may_begin_a_call():
    reader = HermesCallReader()
    assert reader.feed("Hello <to").content == "Hello"
    assert reader.feed("ast> ").content == " <toast>"
    assert reader.feed("\n<tool_call>{").content == ""
    out = reader.feed('"name": "f", "arguments": {}}</tool_call>')
    assert (out.content, [(c.index, c.name, c.arguments) for c in out.calls]) == (
        "", [(0, "f", "{}")])
    assert out.calls[0].id.startswith("call_") and len(out.calls[0].id) == 29


def test_without_parallel_calls_only_the_first_is_kept():
    assert read_all(HermesCallReader(max_calls=1), TWO_CALLS, 3) == (
        "I will check.", [("get_weather", '{"city": "Paris"}')])


def test_a_named_call_streams_its_arguments_as_they_come():
    reader = NamedCallReader("get_weather")
    first, second = reader.feed('{"city": '), reader.feed('"Paris"}')
    assert (first.calls[0].index, first.calls[0].name, first.calls[0].arguments) == (
        0, "get_weather", '{"city": ')
    assert (second.calls[0].id, second.calls[0].arguments) == (None, '"Paris"}')
    assert not reader.finish()
    assert [(c.name, c.arguments) for c in assemble(first.calls + second.calls)] == [
        ("get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize("text, expected", [
    ('[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
     '{"name": "get_time", "parameters": {}}]',
     ("", [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")])),
    ('[{"name": "get_weather", "parameters": {"ci', ('[{"name": "get_weather", '
                                                     '"parameters": {"ci', [])),
])
def test_required_calls_are_read_once_the_array_is_complete(text, expected):
    reader = RequiredCallsReader()
    assert not reader.feed(text)
    assert read_all(RequiredCallsReader(), text, 4) == expected


# -- the request -------------------------------------------------------------------------------

def chat(**fields):
    return parse_chat_request({"messages": USER, **fields})


def test_tools_default_to_auto_and_reach_the_template_as_given():
    request = chat(tools=[WEATHER, TIME])
    assert (request.tool_use.mode, request.tool_use.parallel) == ("auto", True)
    assert request.generation.tools == (WEATHER, {"type": "function",
                                                  "function": {"name": "get_time"}})
    assert request.generation.sampling.structured is None
    assert chat().tool_use.mode == chat(tools=[]).tool_use.mode == "none"
    none = chat(tools=[WEATHER], tool_choice="none")
    assert (none.tool_use.mode, none.generation.tools) == ("none", (WEATHER,))


def test_a_named_function_holds_the_output_to_its_parameters():
    request = chat(tools=[WEATHER, TIME], tool_choice={"type": "function",
                                                       "function": {"name": "get_weather"}})
    assert (request.tool_use.mode, request.tool_use.function) == ("function", "get_weather")
    assert request.generation.sampling.structured == StructuredOutput(
        "json_schema", json.dumps(WEATHER["function"]["parameters"]))
    no_parameters = chat(tools=[TIME], tool_choice={"type": "function",
                                                    "function": {"name": "get_time"}})
    assert json.loads(no_parameters.generation.sampling.structured.spec) == {
        "type": "object", "properties": {}}


@pytest.mark.parametrize("parallel, bound", [(None, {}), (False, {"maxItems": 1})])
def test_required_holds_the_output_to_an_array_of_calls(parallel, bound):
    defs = {"$defs": {"Unit": {"enum": ["C", "F"]}}}
    weather = {"type": "function", "function": {**WEATHER["function"], "parameters": {
        **WEATHER["function"]["parameters"], **defs}}}
    request = chat(tools=[weather, TIME], tool_choice="required", parallel_tool_calls=parallel)
    assert request.tool_use.parallel is (parallel is None)
    assert json.loads(request.generation.sampling.structured.spec) == {
        "type": "array", "minItems": 1, **bound, "$defs": defs["$defs"],
        "items": {"type": "object", "anyOf": [
            {"properties": {"name": {"type": "string", "enum": ["get_weather"]},
                            "parameters": WEATHER["function"]["parameters"]},
             "required": ["name", "parameters"], "additionalProperties": False},
            {"properties": {"name": {"type": "string", "enum": ["get_time"]},
                            "parameters": {"type": "object", "properties": {}}},
             "required": ["name", "parameters"], "additionalProperties": False}]}}


@pytest.mark.parametrize("fields, param, phrase", [
    ({"tools": {"type": "function"}}, "tools", "tools must be an array, got an object"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type",
     'tools[0].type must be "function"'),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "tools[0].function is required"),
    ({"tools": [{"type": "function", "function": {"description": "d"}}]},
     "tools[0].function.name", "tools[0].function.name is required"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "is defined twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters", "must be an object, got a string"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "array"}}}]}, "tools[0].function.parameters", "must be an object schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}]},
     "tools[0].function.returns", "not a field of a function tool"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", 'got \'always\''),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "names function 'nope', which is not among tools (get_weather)"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.function",
     "tool_choice.function is required"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls",
     "must be a boolean"),
])
def test_bad_tool_fields_are_refused_naming_the_field(fields, param, phrase):
    with pytest.raises(OpenAIParamError) as raised:
        chat(**fields)
    assert raised.value.param == param
    assert phrase in str(raised.value)


HISTORY = [*USER,
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "20 C"}]


def test_calls_in_the_history_become_chat_messages_with_dict_arguments_for_the_template():
    messages = parse_chat_request({"messages": HISTORY, "tools": [WEATHER]}).generation.chat
    assert messages[1:] == (
        ChatMessage("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", "20 C", tool_call_id="call_1"))
    assert messages[1].template_message() == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    # As vLLM: arguments that are no JSON object read as {}, so the conversation can go on.
    broken = ChatMessage("assistant", "", (ToolCall("c", "f", "{oops"), ToolCall("d", "g", "[]")))
    assert [call["function"]["arguments"] for call in broken.template_message()["tool_calls"]] \
        == [{}, {}]


@pytest.mark.parametrize("message, param", [
    ({"role": "user", "content": "x", "tool_calls": [HISTORY[1]["tool_calls"][0]]},
     "messages[1].tool_calls"),
    ({"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]},
     "messages[1].tool_calls[0].function.name"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]},
     "messages[1].tool_calls[0].type"),
    ({"role": "tool", "content": "x", "tool_call_id": 5}, "messages[1].tool_call_id"),
])
def test_bad_calls_in_the_history_are_refused_naming_the_field(message, param):
    with pytest.raises(OpenAIParamError) as raised:
        parse_chat_request({"messages": [*USER, message]})
    assert raised.value.param == param


# -- the chat template -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> Path:
    return write_embedded_checkpoint(tmp_path_factory.mktemp("embedded"))


@pytest.fixture(scope="module")
def tokenizer(embedded) -> GatewayTokenizer:
    return GatewayTokenizer.from_files(load_tokenizer_files(embedded, vocab_size=1 << 20).files)


@pytest.mark.parametrize("system", [[], [{"role": "system", "content": "Be brief."}]])
def test_the_embedded_template_renders_tools_and_calls_as_transformers_does(embedded, tokenizer,
                                                                            system):
    request = parse_chat_request({"messages": [*system, *HISTORY,
                                               {"role": "tool", "content": "dry"}],
                                  "tools": [WEATHER, TIME]})
    messages = [m.template_message() for m in request.generation.chat]
    ours = tokenizer.render_chat(messages, True, request.generation.tools)
    reference = AutoTokenizer.from_pretrained(embedded).apply_chat_template(
        messages, tools=list(request.generation.tools), tokenize=False,
        add_generation_prompt=True)
    assert ours == reference
    tools_turn = ("<|system|>" + "".join(m["content"] + "\n\n" for m in system)
                  + "You can call functions.")
    assert ours.startswith(tools_turn)
    assert ours.endswith(
        "<|user|>Weather in Paris?<|end|><|assistant|><tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|end|>'
        "<|user|><tool_response>\n20 C\n</tool_response>\n<tool_response>\ndry\n"
        "</tool_response><|end|><|assistant|>")
    assert f"<tools>\n{json.dumps(WEATHER)}\n{json.dumps(TIME)}\n</tools>" in ours


def test_without_tools_the_embedded_template_renders_as_before(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    assert tokenizer.render_chat(messages, True) == tokenizer.render_chat(messages, True, []) \
        == "<|system|>Be brief.<|end|><|user|>Weather in Paris?<|end|><|assistant|>"


def test_a_request_with_tools_uses_the_models_tool_use_template():
    files = {"tokenizer_config.json": json.dumps({"chat_template": [
        {"name": "default", "template": "D"},
        {"name": "tool_use", "template": "T{{ tools[0].function.name }}"}]}).encode()}
    template = ChatTemplate.from_files(files, {})
    assert template.render(USER) == "D"
    assert template.render(USER, tools=[WEATHER]) == "Tget_weather"


# -- responses from real token ids -------------------------------------------------------------

def events(tokenizer: GatewayTokenizer, text: str, piece: int) -> list[GenerationEvent]:
    """The events a generation of `text` (then EOS) brings, `piece` tokens at a time."""
    ids = [*tokenizer.encode(text), EOS_TOKEN_ID]
    stream = ChoiceStream(0, tokenizer, [1, 2], (), skip_special_tokens=True)
    out = []
    for start in range(0, len(ids), piece):
        last = start + piece >= len(ids)
        delta = stream.advance(ids[start:start + piece], [],
                               finish_reason_to_proto("stop") if last else 0)
        out.append(GenerationEvent([delta], Usage(2, len(ids), 0) if last else None))
    return out


def answer(request, tokenizer, text: str, piece: int) -> tuple[dict, list[dict]]:
    """(the whole body, the streamed chunks) of one generated text."""
    whole = OpenAIResponder(request, "chatcmpl-1", 1700000000, "m")
    streamed = OpenAIResponder(request, "chatcmpl-1", 1700000000, "m")
    chunks = []
    for event in events(tokenizer, text, piece):
        whole.add(event)
        chunks += streamed.chunks(event)
    return whole.response(), chunks


def reassembled(chunks: list[dict], tools) -> ChatCompletion:
    """The chunks as the openai package's stream helper puts them together."""
    state = ChatCompletionStreamState(input_tools=tools)
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


@pytest.mark.parametrize("piece", [1, 3, 100])
def test_auto_calls_in_generated_tokens_become_tool_calls_streamed_or_not(tokenizer, piece):
    request = chat(tools=[WEATHER, TIME])
    body, chunks = answer(request, tokenizer, TWO_CALLS, piece)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "I will check."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]] == [("function", "get_weather", {"city": "Paris"}),
                                                 ("function", "get_time", {})]
    assert all(c["id"].startswith("call_") for c in message["tool_calls"])
    streamed = reassembled(chunks, [WEATHER, TIME]).choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert streamed.message.content == message["content"]
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert [d["tool_calls"][0]["index"] for d in deltas if "tool_calls" in d] == [0, 1]


def test_auto_text_without_calls_is_an_ordinary_answer(tokenizer):
    body, chunks = answer(chat(tools=[WEATHER]), tokenizer, "No tool needed.  ", 2)
    assert body["choices"][0]["message"] == {"role": "assistant",
                                             "content": "No tool needed.  "}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        "No tool needed.  "


def test_a_named_call_streams_its_arguments_and_finishes_with_stop(tokenizer):
    request = chat(tools=[WEATHER], tool_choice={"type": "function",
                                                 "function": {"name": "get_weather"}})
    body, chunks = answer(request, tokenizer, '{"city": "Paris"}', 4)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == (
        "get_weather", '{"city": "Paris"}')
    fragments = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
                 if "tool_calls" in c["choices"][0]["delta"]]
    assert len(fragments) > 2 and "id" in fragments[0] and "id" not in fragments[1]
    streamed = reassembled(chunks, [WEATHER]).choices[0].message.tool_calls[0]
    assert (streamed.id, streamed.function.arguments) == (fragments[0]["id"],
                                                          '{"city": "Paris"}')


def test_required_calls_come_at_the_end(tokenizer):
    request = chat(tools=[WEATHER, TIME], tool_choice="required")
    body, chunks = answer(request, tokenizer,
                          '[{"name": "get_time", "parameters": {}}]', 5)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], c["function"]["arguments"])
            for c in choice["message"]["tool_calls"]] == [("get_time", "{}")]
    assert [c for c in chunks if c["choices"][0]["delta"].get("tool_calls")] == chunks[-1:]
