"""langchain-openai against the gateway, as its users build chains on an OpenAI-compatible
server: `ChatOpenAI(base_url=..., api_key=..., model=...)` to invoke, stream and batch, the
completions LLM `OpenAI(...)` batching prompts, the Responses API (`use_responses_api=True`),
structured output (`with_structured_output` by json_schema and by function calling) and
`bind_tools` with a required tool.

Each answer is checked against the same request sent straight to the API: the body langchain put
on the wire (recorded by the httpx client it is given) replayed over plain HTTP, or the openai
package asked the same question.
"""
from __future__ import annotations

import json
from typing import Literal

import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI, OpenAI
from pydantic import BaseModel

from tests.clients.live_stack import API_KEY, MODEL, LiveStack, RequestLog

MAX_TOKENS = 8
PROMPTS = ["Hello", "Paged attention", "Bye"]


class Verdict(BaseModel):
    """A verdict on a colour."""

    color: Literal["red", "green", "blue"]
    certain: bool


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: Literal["Paris", "Tokyo"]
    unit: Literal["celsius", "fahrenheit"]


def chat_model(stack: LiveStack, log: RequestLog | None = None, **options) -> ChatOpenAI:
    options = {"temperature": 0, "max_tokens": MAX_TOKENS, **options}
    return ChatOpenAI(base_url=stack.base_url, api_key=API_KEY, model=MODEL, max_retries=0,
                      http_client=log.http_client if log else None, **options)


def test_chat_invoke_stream_and_batch_give_the_api_s_answers(stack):
    chat = chat_model(stack, stream_usage=True)
    answer = chat.invoke("Say something")
    with stack.openai() as client:
        direct = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say something"}],
            max_tokens=MAX_TOKENS, temperature=0)
    assert answer.content == direct.choices[0].message.content
    assert answer.response_metadata["finish_reason"] == "length"
    assert answer.usage_metadata["input_tokens"] == direct.usage.prompt_tokens
    assert answer.usage_metadata["output_tokens"] == MAX_TOKENS

    chunks = list(chat.stream("Say something"))
    assert len(chunks) > 2
    assert "".join(chunk.content for chunk in chunks) == answer.content
    streamed = sum(chunks[1:], chunks[0])
    assert streamed.usage_metadata["output_tokens"] == MAX_TOKENS

    batch = chat.batch(["Say something", "Say more"])
    assert batch[0].content == answer.content
    assert batch[1].content == chat.invoke("Say more").content


def test_chat_over_the_responses_api_gives_the_chat_completions_answer(stack):
    # use_responses_api: the same conversation through POST /v1/responses.
    chat = chat_model(stack, use_responses_api=True)
    with stack.openai() as client:
        direct = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say something"}],
            max_tokens=MAX_TOKENS, temperature=0).choices[0].message.content
    answer = chat.invoke("Say something")
    assert answer.text == direct
    assert answer.response_metadata["status"] == "incomplete"
    assert answer.response_metadata["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer.usage_metadata["output_tokens"] == MAX_TOKENS
    assert "".join(chunk.text for chunk in chat.stream("Say something")) == direct


def test_completion_llm_sends_a_batch_as_one_prompt_list(stack):
    log = RequestLog()
    llm = OpenAI(base_url=stack.base_url, api_key=API_KEY, model=MODEL, temperature=0,
                 max_tokens=MAX_TOKENS, max_retries=0, http_client=log.http_client)
    texts = llm.batch(PROMPTS)
    (body,) = log.bodies
    assert body["prompt"] == PROMPTS
    with stack.openai() as client:
        alone = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0).choices[0].text
                 for prompt in PROMPTS]
    assert texts == alone


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_parses_into_the_schema(stack, method):
    log = RequestLog()
    structured = chat_model(stack, log, max_tokens=200).with_structured_output(
        Verdict, method=method, include_raw=True)
    result = structured.invoke("Which colour, and are you sure?")
    assert result["parsing_error"] is None
    verdict = result["parsed"]
    assert isinstance(verdict, Verdict)
    (body,) = log.bodies
    replayed = stack.post("/v1/chat/completions", body)["choices"][0]["message"]
    raw: AIMessage = result["raw"]
    if method == "json_schema":
        assert body["response_format"]["type"] == "json_schema"
        assert raw.content == replayed["content"]
        assert verdict == Verdict.model_validate_json(raw.content)
    else:
        assert body["tool_choice"] == {"type": "function", "function": {"name": "Verdict"}}
        (call,) = replayed["tool_calls"]
        assert call["function"]["name"] == "Verdict"
        assert verdict == Verdict.model_validate_json(call["function"]["arguments"])


@pytest.mark.parametrize("tool_choice", ["GetWeather", "any"])
def test_bind_tools_with_a_required_tool_returns_its_call(stack, tool_choice):
    log = RequestLog()
    # One call wanted: parallel_tool_calls false, as a caller who handles one call asks.
    chat = chat_model(stack, log, max_tokens=200).bind_tools(
        [GetWeather], tool_choice=tool_choice, parallel_tool_calls=False)
    answer = chat.invoke("What is the weather like?")
    (call,) = answer.tool_calls
    assert call["name"] == "GetWeather"
    GetWeather.model_validate(call["args"])
    # As OpenAI answers: "tool_calls" when the model had to call some tool, "stop" when the
    # request named the one it must call.
    assert answer.response_metadata["finish_reason"] == (
        "tool_calls" if tool_choice == "any" else "stop")
    (body,) = log.bodies
    assert body["tool_choice"] == ("required" if tool_choice == "any" else {
        "type": "function", "function": {"name": "GetWeather"}})
    (replayed,) = stack.post("/v1/chat/completions", body)["choices"][0]["message"]["tool_calls"]
    assert replayed["function"]["name"] == "GetWeather"
    assert json.loads(replayed["function"]["arguments"]) == call["args"]
