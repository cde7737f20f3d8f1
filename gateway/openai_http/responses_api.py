"""OpenAI's Responses API (POST /v1/responses) over the chat path: a request body becomes the
chat request it means, and the gateway's GenerationEvents become a Response object or its typed
stream events. Pure translation: no HTTP, no I/O.

Request: `input` is a string (one user message) or an array of message items ({"role",
"content"}, `type` "message" or absent), roles user, assistant, system and developer (read as
system), content a string or an array of input_text / output_text parts, joined; a Response's
own output items can be sent back as input. `instructions` becomes a system message ahead of
them. `max_output_tokens` is the chat request's max_completion_tokens. The sampling fields vLLM's
Responses server shares with its chat server (temperature, top_p, top_k, seed, stop, ...) are
handed to the chat parser as they are, so they mean, default and fail exactly as on
/v1/chat/completions. Nothing is stored: `store` is accepted and ignored, as vLLM ignores it
unless told to keep responses, and there is no GET /v1/responses/{id}; `previous_response_id`
is refused. Every other field is refused naming it unless it asks for nothing (fields.py's
rules over this endpoint's own registry, responses_fields.py).

Response: one assistant message holding one output_text part. Status "completed"; "incomplete"
with incomplete_details.reason "max_output_tokens" when the output ran out of tokens (as vLLM,
also when the context window was the limit); "cancelled" when the executor ended it early.

Stream: response.created, response.in_progress, response.output_item.added,
response.content_part.added, one response.output_text.delta per text delta,
response.output_text.done, response.content_part.done, response.output_item.done, then
response.completed, or response.incomplete (OpenAI's name for a response that ends otherwise;
vLLM sends response.completed for both). Each event carries `sequence_number` from 0 and is sent
as an SSE event named by its type; there is no [DONE]. A failure mid-stream is an `error` event,
the last one.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.generation import GenerationEvent, Usage
from gateway.generation_request import GenerationRequest
from gateway.openai_http.fields import refused_key
from gateway.openai_http.json_values import OpenAIParamError, expect, json_object
from gateway.openai_http.requests import parse_chat_request
from gateway.openai_http.responses_fields import RESPONSES_FIELDS, SHARED_WITH_CHAT

# OpenAI's item roles; developer is the newer name for system.
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    generation: GenerationRequest
    stream: bool
    # Echoed in the Response object, as OpenAI's and vLLM's echo them.
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    metadata: dict | None
    user: str | None

    @property
    def generations(self) -> tuple[GenerationRequest, ...]:
        return (self.generation,)


def parse_responses_request(body: object) -> ResponsesRequest:
    body = json_object(body)
    refusal = refused_key(body, RESPONSES_FIELDS)
    if refusal is not None:
        raise OpenAIParamError(*refusal)
    instructions = _optional(body, "instructions", "string")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + \
        _messages(body.get("input"))
    max_output_tokens = _optional(body, "max_output_tokens", "integer")
    if max_output_tokens is not None and max_output_tokens < 1:
        raise OpenAIParamError(f"max_output_tokens must be >= 1, got {max_output_tokens}",
                               "max_output_tokens")
    chat = {name: body[name] for name in SHARED_WITH_CHAT if name in body}
    generation = parse_chat_request({**chat, "messages": messages,
                                     "max_completion_tokens": max_output_tokens}).generation
    return ResponsesRequest(
        generation, stream=bool(_optional(body, "stream", "boolean")),
        instructions=instructions, max_output_tokens=max_output_tokens,
        temperature=generation.sampling.temperature, top_p=generation.sampling.top_p,
        metadata=_optional(body, "metadata", "object"), user=_optional(body, "user", "string"))


def _optional(body: dict[str, Any], name: str, kind: str) -> Any:
    value = body.get(name)
    return None if value is None else expect(value, name, kind)


def _messages(value: Any) -> list[dict[str, str]]:
    """`input` as chat messages: a string is one user message."""
    if value is None:
        raise OpenAIParamError("input is required", "input")
    if isinstance(expect(value, "input", "string", "array"), str):
        return [{"role": "user", "content": value}]
    if not value:
        raise OpenAIParamError("input must hold at least one item", "input")
    return [_message(item, f"input[{index}]") for index, item in enumerate(value)]


def _message(item: Any, where: str) -> dict[str, str]:
    expect(item, where, "object")
    kind = item.get("type", "message")
    if kind != "message":
        raise OpenAIParamError(f"{where}.type: only message items are supported, got "
                               f"{kind!r}", f"{where}.type")
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise OpenAIParamError(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}",
                               f"{where}.role")
    content = item.get("content")
    if content is None:
        raise OpenAIParamError(f"{where}.content is required", f"{where}.content")
    return {"role": ROLES[role], "content": _text(content, f"{where}.content")}


def _text(content: Any, where: str) -> str:
    if isinstance(expect(content, where, "string", "array"), str):
        return content
    texts = []
    for index, part in enumerate(content):
        here = f"{where}[{index}]"
        expect(part, here, "object")
        if part.get("type") not in TEXT_PARTS:
            raise OpenAIParamError(f"{here}.type: only text parts ({', '.join(TEXT_PARTS)}) are "
                                   f"supported, got {part.get('type')!r}", f"{here}.type")
        texts.append(expect(part.get("text"), f"{here}.text", "string"))
    return "".join(texts)


# -- the response ------------------------------------------------------------------------------
# The choice's finish reason as the Response's status ("stop": end-of-sequence, a stop token
# or string; "length": out of tokens; "cancelled": ended by the executor).
STATUS = {None: "completed", "stop": "completed", "length": "incomplete",
          "cancelled": "cancelled"}
# The message item's own status has no "cancelled".
ITEM_STATUS = {"completed": "completed", "incomplete": "incomplete", "cancelled": "incomplete"}
LAST_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
              "cancelled": "response.incomplete"}


def usage_object(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


@dataclass(slots=True)
class ResponsesResponder:
    """One response's translation, in the shape of responses.py's OpenAIResponder: chunks() per
    event (streaming; the events to send), or add() per event then response() (a whole body)."""
    request: ResponsesRequest
    response_id: str
    created: int
    model: str
    item_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    texts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    # Streaming: the next event's sequence_number; 0 until the opening events went out.
    sequence: int = 0
    # The Responses API's stream ends with its last response.* event, not OpenAI's [DONE].
    ends_with_done = False

    def chunks(self, event: GenerationEvent) -> list[dict]:
        events = []
        if self.sequence == 0:
            events += [{"type": "response.created", "response": self._response("in_progress")},
                       {"type": "response.in_progress",
                        "response": self._response("in_progress")},
                       {"type": "response.output_item.added", "output_index": 0,
                        "item": self._item("in_progress", [])},
                       {"type": "response.content_part.added", **self._where(),
                        "part": _output_text("")}]
        for text in self._take(event):
            events.append({"type": "response.output_text.delta", **self._where(),
                           "delta": text, "logprobs": []})
        if event.usage is not None:
            status, text = self._status(), "".join(self.texts)
            events += [{"type": "response.output_text.done", **self._where(), "text": text,
                        "logprobs": []},
                       {"type": "response.content_part.done", **self._where(),
                        "part": _output_text(text)},
                       {"type": "response.output_item.done", "output_index": 0,
                        "item": self._item(ITEM_STATUS[status], [_output_text(text)])},
                       {"type": LAST_EVENT[status], "response": self.response()}]
        for body in events:
            body["sequence_number"], self.sequence = self.sequence, self.sequence + 1
        return events

    def add(self, event: GenerationEvent) -> None:
        self._take(event)

    def response(self) -> dict:
        """The whole Response of the events taken in."""
        status = self._status()
        return self._response(status, [self._item(ITEM_STATUS[status],
                                                   [_output_text("".join(self.texts))])])

    def error_chunk(self, message: str, type_: str, param: str | None, code: str | None
                    ) -> dict:
        """The `error` event that ends a stream that failed."""
        body = {"type": "error", "code": code or type_, "message": message, "param": param,
                "sequence_number": self.sequence}
        self.sequence += 1
        return body

    def _take(self, event: GenerationEvent) -> list[str]:
        """The texts of `event`'s deltas, kept; its finish reason and usage too."""
        texts = []
        for delta in event.choices:
            if delta.finish_reason == "error":   # the HTTP layer answers the failure
                continue
            if delta.text:
                texts.append(delta.text)
            self.finish_reason = delta.finish_reason or self.finish_reason
        self.texts += texts
        if event.usage is not None:
            self.usage = event.usage
        return texts

    def _status(self) -> str:
        return STATUS[self.finish_reason]

    def _where(self) -> dict:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def _item(self, status: str, content: list[dict]) -> dict:
        return {"type": "message", "id": self.item_id, "role": "assistant", "status": status,
                "content": content}

    def _response(self, status: str, output: list[dict] | None = None) -> dict:
        request = self.request
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.response_id, "object": "response", "created_at": self.created,
                "status": status, "error": None, "incomplete_details": incomplete,
                "instructions": request.instructions,
                "max_output_tokens": request.max_output_tokens, "model": self.model,
                "output": output or [], "parallel_tool_calls": False,
                "previous_response_id": None, "reasoning": None,
                "temperature": request.temperature, "top_p": request.top_p,
                "text": {"format": {"type": "text"}}, "tool_choice": "none", "tools": [],
                "truncation": "disabled", "metadata": request.metadata, "user": request.user,
                "background": False, "store": False,
                "usage": None if self.usage is None or status == "in_progress"
                else usage_object(self.usage)}


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
