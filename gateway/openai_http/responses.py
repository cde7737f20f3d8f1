"""The gateway's GenerationEvents as OpenAI response JSON (plain dicts) for /v1/completions and
/v1/chat/completions: streamed, one chunk dict per server-sent event, or one whole body.
Pure translation: no HTTP, no I/O.

A streamed chat choice opens with a chunk whose delta is {"role": "assistant", "content": ""},
as OpenAI's do; after that, a chunk goes out only for a delta with text, logprobs or a finish
reason. A choice that ends with an error is left out of the response: `error_of` finds it,
and the HTTP layer answers with an error instead.

Logprobs: completions get OpenAI's legacy object (tokens, token_logprobs, top_logprobs,
text_offset), chat the newer one (content: token, logprob, bytes, top_logprobs). A text_offset
is where the token starts in the choice's text: the length of the text sent before its delta,
plus the texts of the delta's earlier tokens. The whole body and the concatenated chunks agree,
as both count offsets delta by delta.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gateway.choice_stream import ChoiceDelta, TokenLogprob
from gateway.generation import GenerationEvent, Usage
from gateway.openai_http.requests import OpenAIRequest

FINISH_REASONS = {None: None, "stop": "stop", "length": "length",
                  # OpenAI has no word for a choice ended from outside (the client went away,
                  # the executor stopped); vLLM says "abort", which OpenAI clients of vLLM know.
                  "cancelled": "abort"}
# Strict JSON has no -Infinity; a token the sampler could never pick reports this instead
# (vLLM's choice too).
MIN_LOGPROB = -9999.0


def error_of(event: GenerationEvent) -> str | None:
    """The error the first choice that failed in `event` ended with, None if none did."""
    return event.failure


def usage_object(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


@dataclass(slots=True)
class _Choice:
    # Characters of the choice's text so far: where the next delta's text_offsets start.
    length: int = 0
    role_sent: bool = False        # streamed chat: the opening chunk went out
    finish_reason: str | None = None
    # Whole bodies only: the choice so far.
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def advance(self, delta: ChoiceDelta) -> list[int]:
        """The text_offsets of the delta's tokens."""
        offsets = []
        offset = self.length
        for entry in delta.logprobs:
            offsets.append(offset)
            offset += len(entry.token)
        self.length += len(delta.text)
        self.finish_reason = delta.finish_reason or self.finish_reason
        return offsets


class OpenAIResponder:
    """One response's translation. Use either chunks() per event (streaming) or add() per event
    then response() (a whole body), not both."""

    def __init__(self, request: OpenAIRequest, response_id: str, created: int, model: str
                 ) -> None:
        self._request = request
        self._head = {"id": response_id, "object": "", "created": created, "model": model}
        self._choices: dict[int, _Choice] = {}
        self._usage: Usage | None = None

    def chunks(self, event: GenerationEvent) -> list[dict]:
        """The chunks to send for `event`, zero or more."""
        chunks = []
        for delta in event.choices:
            if delta.finish_reason == "error":
                continue
            choice = self._choices.setdefault(delta.index, _Choice())
            if self._request.chat and not choice.role_sent:
                choice.role_sent = True
                chunks.append(self._chunk([{"index": delta.index,
                                            "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]))
            has_logprobs = self._request.logprobs and delta.logprobs
            if not (delta.text or has_logprobs or delta.finish_reason):
                continue
            offsets = choice.advance(delta)
            logprobs = self._logprobs(delta.logprobs, offsets) if has_logprobs else None
            if self._request.chat:
                body = {"delta": {"content": delta.text} if delta.text else {}}
            else:
                body = {"text": delta.text}
            chunks.append(self._chunk([{"index": delta.index, **body, "logprobs": logprobs,
                                        "finish_reason": FINISH_REASONS[delta.finish_reason]}]))
        if event.usage is not None and self._request.include_usage:
            chunks.append(self._chunk([], usage_object(event.usage)))
        return chunks

    def add(self, event: GenerationEvent) -> None:
        """Takes in `event` for the whole body."""
        for delta in event.choices:
            if delta.finish_reason == "error":
                continue
            choice = self._choices.setdefault(delta.index, _Choice())
            choice.offsets += choice.advance(delta)
            choice.texts.append(delta.text)
            choice.logprobs += delta.logprobs
        if event.usage is not None:
            self._usage = event.usage

    def response(self) -> dict:
        """The whole body of the events added, choices by index."""
        choices = []
        for index in sorted(self._choices):
            choice = self._choices[index]
            text = "".join(choice.texts)
            body = ({"message": {"role": "assistant", "content": text}} if self._request.chat
                    else {"text": text})
            choices.append({"index": index, **body,
                            "logprobs": self._logprobs(choice.logprobs, choice.offsets),
                            "finish_reason": FINISH_REASONS[choice.finish_reason]})
        return {**self._head, "object": "chat.completion" if self._request.chat
                else "text_completion", "choices": choices,
                "usage": None if self._usage is None else usage_object(self._usage)}

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        chunk = {**self._head, "object": "chat.completion.chunk" if self._request.chat
                 else "text_completion", "choices": choices}
        if self._request.include_usage:
            chunk["usage"] = usage
        return chunk

    def _logprobs(self, entries: list[TokenLogprob], offsets: list[int]) -> dict | None:
        if not self._request.logprobs:
            return None
        if self._request.chat:
            return chat_logprobs(entries)
        return completion_logprobs(entries, offsets)


def completion_logprobs(entries: list[TokenLogprob], offsets: list[int]) -> dict:
    """The legacy object; a top_logprobs entry is {token text: logprob}. With no alternatives
    asked for (logprobs 0) it holds the chosen token alone, as vLLM's does, not an empty {}."""
    return {"tokens": [entry.token for entry in entries],
            "token_logprobs": [_finite(entry.logprob) for entry in entries],
            "top_logprobs": [{top.token: _finite(top.logprob) for top in entry.top}
                             or {entry.token: _finite(entry.logprob)} for entry in entries],
            "text_offset": offsets}


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    return {"content": [{**_chat_token(entry.token, entry.logprob),
                         "top_logprobs": [_chat_token(top.token, top.logprob)
                                          for top in entry.top]}
                        for entry in entries]}


def _chat_token(token: str, logprob: float) -> dict:
    # The bytes of the token's decoded text: a token holding part of a UTF-8 character
    # decodes to U+FFFD, so its bytes are those of U+FFFD, not the token's own.
    return {"token": token, "logprob": _finite(logprob),
            "bytes": list(token.encode("utf-8", "replace"))}


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)
