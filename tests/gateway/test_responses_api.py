"""OpenAI's Responses API (POST /v1/responses), driven by the official `openai` package against
real allocator, executor and gateway processes: the answers equal the chat endpoint's for the
conversation they mean, streamed or whole, and every field it does not implement is refused."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from gateway.openai_http.fields import Field, Handling
from gateway.openai_http.responses_fields import RESPONSES_FIELDS, SHARED_WITH_CHAT
from tests.support.allocator_wire import used_blocks
from tests.support.polling import wait_for

MODEL = "pagedserve-embedded-llama"
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})
HTTP_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "api-http.md"
OPENING = ["response.created", "response.in_progress", "response.output_item.added",
           "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done",
           "response.output_item.done"]


@pytest.fixture(scope="module")
def http(stack) -> httpx.Client:
    _, gateway = stack
    with httpx.Client(base_url=gateway.http_url, timeout=60) as client:
        yield client


def chat_answer(client: openai.OpenAI, messages: list[dict], max_tokens: int):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                          **GREEDY)


def test_text_input_is_one_user_message(stack, client):
    allocator, _ = stack
    response = client.responses.create(model=MODEL, input="Say something",
                                       max_output_tokens=8, **GREEDY)
    chat = chat_answer(client, [{"role": "user", "content": "Say something"}], 8)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.model == MODEL
    (message,) = response.output
    assert (message.type, message.role) == ("message", "assistant")
    (part,) = message.content
    assert (part.type, part.annotations) == ("output_text", [])
    assert response.output_text == part.text == chat.choices[0].message.content
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        chat.usage.prompt_tokens, 8, chat.usage.prompt_tokens + 8)
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.input_tokens_details.cached_tokens >= 0
    wait_for(lambda: used_blocks(allocator) == 0)


def test_message_items_with_text_parts_read_as_their_joined_text(client):
    parts = client.responses.create(model=MODEL, max_output_tokens=6, input=[
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Say "}, {"type": "input_text", "text": "something"}]}],
        **GREEDY)
    plain = client.responses.create(model=MODEL, max_output_tokens=6,
                                    input=[{"role": "user", "content": "Say something"}],
                                    **GREEDY)
    assert parts.output_text == plain.output_text
    assert parts.usage.input_tokens == plain.usage.input_tokens


def test_a_conversation_with_an_earlier_output_equals_the_chat_answer(client):
    first = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, **GREEDY)
    # The earlier Response's output item is sent back as it came, as the SDK's docs show.
    response = client.responses.create(model=MODEL, max_output_tokens=6, input=[
        {"role": "user", "content": "Hi"}, first.output[0].model_dump(),
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "More"}],
        **GREEDY)
    chat = chat_answer(client, [{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": first.output_text},
                                {"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "More"}], 6)
    assert response.output_text == chat.choices[0].message.content


def test_instructions_are_a_system_message_ahead_of_the_input(client):
    response = client.responses.create(model=MODEL, instructions="Be brief.",
                                       input="Say something", max_output_tokens=8, **GREEDY)
    chat = chat_answer(client, [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Say something"}], 8)
    without = client.responses.create(model=MODEL, input="Say something", max_output_tokens=8,
                                      **GREEDY)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.input_tokens > without.usage.input_tokens
    assert response.instructions == "Be brief."


def test_running_out_of_max_output_tokens_leaves_the_response_incomplete(client):
    response = client.responses.create(model=MODEL, input="Count", max_output_tokens=3,
                                       **GREEDY)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.usage.output_tokens == 3 and response.max_output_tokens == 3
    events = list(client.responses.create(model=MODEL, input="Count", max_output_tokens=3,
                                          stream=True, **GREEDY))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == response.output_text


def test_streamed_events_reassemble_the_whole_response(client):
    # A stop string cut from the greedy text ends the answer with "stop": status completed.
    whole = client.responses.create(model=MODEL, input="Tell me", max_output_tokens=12,
                                    **GREEDY).output_text
    stop = whole[len(whole) // 2:len(whole) // 2 + 2]
    expected = whole[:whole.index(stop)]
    asked = dict(model=MODEL, input="Tell me", max_output_tokens=12, temperature=0,
                 extra_body={"ignore_eos": True, "stop": [stop]})
    events = list(client.responses.create(stream=True, **asked))
    types = [event.type for event in events]
    assert types[:4] == OPENING and types[-4:] == CLOSING + ["response.completed"]
    assert set(types[4:-4]) <= {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected
    assert events[-4].text == events[-3].part.text == expected
    assert events[-2].item.status == "completed"
    final = events[-1].response
    assert (final.id, final.status, final.output_text) == (
        events[0].response.id, "completed", expected)
    assert final.usage.output_tokens >= 1 and final.usage.total_tokens == (
        final.usage.input_tokens + final.usage.output_tokens)
    assert client.responses.create(**asked).output_text == expected
    # The SDK's own helper follows the events to the final Response.
    with client.responses.stream(**asked) as stream:
        assert stream.get_final_response().output_text == expected


def test_events_are_named_server_sent_events_without_done(http):
    with http.stream("POST", "/v1/responses", json={
            "model": MODEL, "input": "Hi", "max_output_tokens": 2, "stream": True}) as answer:
        lines = [line for line in answer.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert names[:4] == OPENING and names[-1] in ("response.completed", "response.incomplete")
    assert len(names) * 2 == len(lines) and "data: [DONE]" not in lines


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 4}, "max_tokens"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
     "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": "hot"}, "temperature"),
])
def test_a_malformed_request_is_refused_naming_the_field(http, body, param):
    answer = http.post("/v1/responses", json={"model": MODEL, "input": "Hi", **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


ROWS = [entry for entry in RESPONSES_FIELDS.values() if entry.example is not None
        and entry.handling is not Handling.SUPPORTED]


@pytest.mark.parametrize("entry", ROWS, ids=[entry.name for entry in ROWS])
def test_every_field_is_refused_or_ignored_as_the_registry_says(http, entry: Field):
    def send(fields: dict) -> httpx.Response:
        return http.post("/v1/responses", json={"model": MODEL, "input": "Hi",
                                                "max_output_tokens": 1, **fields})

    answer = send(entry.example)
    if entry.handling is Handling.REFUSED:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["message"], error["param"]) == (entry.refusal(), entry.name)
        for neutral in entry.neutral:
            accepted = send({entry.name: neutral})
            assert accepted.status_code == 200, (neutral, accepted.text)
    else:
        assert answer.status_code == 200, answer.text


def test_the_docs_list_every_field_as_the_registry_handles_it():
    text = HTTP_REFERENCE.read_text()
    section = text[text.index("## POST /v1/responses"):]
    section = section[:section.index("\n## ", 1)]
    documented = dict(re.findall(r"^\| `(\w+)` \| (supported|refused|ignored) \|", section,
                                 re.MULTILINE))
    assert documented == {name: entry.handling.value for name, entry in RESPONSES_FIELDS.items()
                          if name not in SHARED_WITH_CHAT}
    shared = section[section.index("<!-- shared-with-chat -->"):].split("\n\n")[0]
    assert re.findall(r"`(\w+)`", shared) == list(SHARED_WITH_CHAT)
