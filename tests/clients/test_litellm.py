"""litellm against the gateway, through its generic OpenAI-compatible provider as its docs say:
`model="openai/<served model>"` with `api_base` and `api_key`, for chat (whole and streamed),
text completion, the Responses API and tools. Each answer is checked against the openai
package's for the same request.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.clients.live_stack import API_KEY, MODEL

MAX_TOKENS = 8
MESSAGES = [{"role": "user", "content": "Say something"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def litellm() -> Iterator[ModuleType]:
    """litellm imported with its bundled model price map: by default it first tries to
    download one from GitHub, which an offline machine waits out."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm
        yield litellm


@pytest.fixture
def served(stack) -> dict:
    return {"model": f"openai/{MODEL}", "api_base": stack.base_url, "api_key": API_KEY}


def test_chat_whole_and_streamed_equal_the_openai_answer(stack, litellm, served):
    with stack.openai() as client:
        direct = client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                max_tokens=MAX_TOKENS, temperature=0)
    answer = litellm.completion(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                **served)
    assert answer.choices[0].message.content == direct.choices[0].message.content
    assert answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (
        direct.usage.prompt_tokens, MAX_TOKENS)

    chunks = list(litellm.completion(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                     stream=True, stream_options={"include_usage": True},
                                     **served))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == direct.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_text_completion_equals_the_openai_answer(stack, litellm, served):
    with stack.openai() as client:
        direct = client.completions.create(model=MODEL, prompt="Hello", max_tokens=MAX_TOKENS,
                                           temperature=0)
    answer = litellm.text_completion(prompt="Hello", max_tokens=MAX_TOKENS, temperature=0,
                                     **served)
    assert answer.choices[0].text == direct.choices[0].text
    assert answer.usage.completion_tokens == MAX_TOKENS


def test_responses_equal_the_openai_answer(stack, litellm, served):
    # litellm raises max_output_tokens to OpenAI's minimum, 16.
    answer = litellm.responses(input="Say something", max_output_tokens=16, temperature=0,
                               **served)
    with stack.openai() as client:
        direct = client.responses.create(model=MODEL, input="Say something",
                                         max_output_tokens=16, temperature=0)
    assert answer.output[0].content[0].text == direct.output_text
    assert (answer.status, answer.usage.output_tokens) == ("incomplete", 16)


def test_a_required_tool_comes_back_as_a_tool_call(stack, litellm, served):
    # One call wanted: parallel_tool_calls false, as a caller who handles one call asks.
    request = dict(messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL],
                   tool_choice="required", parallel_tool_calls=False, max_tokens=200,
                   temperature=0)
    answer = litellm.completion(**request, **served)
    message = answer.choices[0].message
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Tokyo")
    assert answer.choices[0].finish_reason == "tool_calls"
    with stack.openai() as client:
        direct = client.chat.completions.create(model=MODEL, **request)
    assert call.function.arguments == direct.choices[0].message.tool_calls[0].function.arguments
