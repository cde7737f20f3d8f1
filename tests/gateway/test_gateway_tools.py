"""Tool calling over HTTP, driven by the official `openai` package against real allocator,
executor and gateway processes serving the embedded (random) model: its free text never calls a
tool, so the calls come from the grammar (tool_choice required or named, or a regex)."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

MODEL = "pagedserve-embedded-llama"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"],
        "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
HISTORY = [*USER,
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather",
                             "arguments": '{"city": "Paris", "unit": "C"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "20 C, sunny"}]
GREEDY = dict(temperature=0, max_tokens=48)


def streamed(client: openai.OpenAI, **request):
    """The streamed answer as the openai package's stream helper assembles it (its snapshot:
    get_final_completion refuses an answer cut by max_tokens)."""
    with client.chat.completions.stream(model=MODEL, **request) as stream:
        for _ in stream:
            pass
        return stream.current_completion_snapshot


def calls_of(message) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments))
            for call in message.tool_calls or []]


def test_tool_choice_none_answers_in_text(client):
    answer = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER],
                                            tool_choice="none", max_tokens=8,
                                            extra_body={"ignore_eos": True})
    (choice,) = answer.choices
    assert (choice.finish_reason, choice.message.tool_calls) == ("length", None)
    assert len(choice.message.content) > 0


def test_tools_reach_the_template_and_auto_text_stays_text(client, stack):
    _, gateway = stack
    answer = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER],
                                            **GREEDY)
    (choice,) = answer.choices
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.tool_calls is None and choice.message.content
    prompt = httpx.post(f"{gateway.http_url}/tokenize", json={
        "messages": USER, "tools": [WEATHER]}).json()
    bare = httpx.post(f"{gateway.http_url}/tokenize", json={"messages": USER}).json()
    assert answer.usage.prompt_tokens == prompt["count"] > bare["count"] + 200
    again = streamed(client, messages=USER, tools=[WEATHER], **GREEDY).choices[0]
    assert (again.message.content, again.finish_reason) == (choice.message.content,
                                                            choice.finish_reason)


def test_a_conversation_with_calls_and_results_renders_and_generates(client, stack):
    _, gateway = stack
    answer = client.chat.completions.create(model=MODEL, messages=HISTORY, tools=[WEATHER],
                                            max_tokens=4, extra_body={"ignore_eos": True})
    assert answer.choices[0].finish_reason == "length"
    tokens = httpx.post(f"{gateway.http_url}/tokenize", json={
        "messages": HISTORY, "tools": [WEATHER], "return_token_strs": True}).json()
    assert answer.usage.prompt_tokens == tokens["count"]
    text = "".join(tokens["token_strs"])
    assert "<tool_response>" in text and "20Ġ" in text   # byte-level symbols: Ġ is a space


def test_a_named_function_is_called_with_arguments_matching_its_schema(client):
    request = dict(messages=USER, tools=[WEATHER, TIME], **GREEDY,
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
    answer = client.chat.completions.create(model=MODEL, **request)
    (choice,) = answer.choices
    assert (choice.finish_reason, choice.message.content) == ("stop", None)
    ((name, arguments),) = calls_of(choice.message)
    assert name == "get_weather" and set(arguments) == {"city", "unit"}
    assert isinstance(arguments["city"], str) and arguments["unit"] in ("C", "F")
    assert choice.message.tool_calls[0].id.startswith("call_")
    again = streamed(client, **request).choices[0]
    assert calls_of(again.message) == calls_of(choice.message)


def test_required_makes_a_call_to_one_of_the_tools(client):
    request = dict(messages=USER, tools=[WEATHER, TIME], tool_choice="required",
                   parallel_tool_calls=False, temperature=0.9, seed=11, max_tokens=160)
    answer = client.chat.completions.create(model=MODEL, **request)
    (choice,) = answer.choices
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    ((name, arguments),) = calls_of(choice.message)
    assert name in ("get_weather", "get_time")
    assert set(arguments) == ({"city", "unit"} if name == "get_weather" else set())
    again = streamed(client, **request).choices[0]
    assert (calls_of(again.message), again.finish_reason) == ([(name, arguments)],
                                                              "tool_calls")


def test_required_calls_cut_short_by_max_tokens_come_back_as_text(client):
    # With parallel calls the random model never closes the array.
    answer = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER, TIME],
                                            tool_choice="required", temperature=0, max_tokens=60)
    (choice,) = answer.choices
    assert (choice.finish_reason, choice.message.tool_calls) == ("length", None)
    assert choice.message.content.startswith('[{"name": "get_')


def test_auto_reads_a_call_the_model_writes(client):
    # The random model never writes a call by itself: a regex makes it write one.
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
    pattern = "Let me check\\.\n" + _regex_escape(call) + "</tool_call>"
    request = dict(messages=USER, tools=[WEATHER], max_tokens=120, temperature=0,
                   extra_body={"structured_outputs": {"regex": pattern}})
    try:
        answer = client.chat.completions.create(model=MODEL, **request)
    except openai.BadRequestError as error:
        if "structured_outputs is not supported" in str(error):
            pytest.skip("structured_outputs is not served yet: no way to make the model call")
        raise
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert calls_of(choice.message) == [("get_weather", {"city": "Paris", "unit": "C"})]
    again = streamed(client, **request).choices[0]
    assert (again.message.content, calls_of(again.message)) == (
        "Let me check.", calls_of(choice.message))


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in "{}[]().*+?|^$\\" else c for c in text)


@pytest.mark.parametrize("fields, param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]},
     "tools[0].function.name"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
     "messages[1].tool_calls[0].function.name"),
])
def test_bad_tool_requests_get_a_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, **{"messages": USER, "max_tokens": 2,
                                                       **fields})
    assert raised.value.body["param"] == param
