"""The gateway's GenerationEvents as OpenAI response JSON (plain dicts) for /v1/completions and
/v1/chat/completions: streamed, one chunk dict per server-sent event, or one whole body.
Pure translation: no HTTP, no I/O.

A streamed chat choice opens with a chunk whose delta is {"role": "assistant", "content": ""},
as OpenAI's do; after that, a chunk goes out only for a delta with text, logprobs or a finish
reason. A choice that ends with an error is left out of the response: `error_of` finds it,
and the HTTP layer answers with an error instead.

Chat with tools: a choice's text goes through its reader (gateway/tool_calls.py). Deltas carry
the text outside calls as `content` and the calls as `tool_calls` fragments: a call's first
fragment has its index, id, type and name, later ones only more arguments. The whole message
lists the calls, with content null when the model wrote nothing else. A choice that called a
function and then stopped finishes with "tool_calls" (auto, required) or "stop" (a named
function), as vLLM's do.

Logprobs: completions get OpenAI's legacy object (tokens, token_logprobs, top_logprobs,
text_offset), chat the newer one (content: token, logprob, bytes, top_logprobs). A text_offset
is where the token starts in the choice's text (gateway/choice_stream.py counts them; an echoed
prompt's text comes first).

Echo (completions): a choice's first delta is preceded by the prompt's text and, with logprobs,
the prompt's tokens (the first with a null logprob and null top_logprobs, as in OpenAI's and
vLLM's answers; each top_logprobs dict of a prompt token holds the token itself besides the
most likely ones, as vLLM's does). vLLM's `prompt_logprobs` field comes in vLLM's shape: per
prompt token null (the first) or {token id: {logprob, rank, decoded_token}}, per choice on
completions and once for the response on chat.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from gateway.choice_stream import ChoiceDelta, TokenLogprob
from gateway.generation import GenerationEvent, Usage
from gateway.openai_http.errors import error_body
from gateway.openai_http.requests import OpenAIRequest
from gateway.prompt_report import PromptReport
from gateway.tool_calls import CallFragment, CallReader, ReadOut, assemble

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
    # Echoing: the prompt's length, where the completion's text starts (its deltas'
    # text_offsets count from there).
    base: int = 0
    role_sent: bool = False        # streamed chat: the opening chunk went out
    finish_reason: str | None = None
    # Chat with tools: reads the text as content and tool calls (gateway/tool_calls.py).
    reader: CallReader | None = None
    # Whole bodies only: the choice so far (its content, with tools).
    texts: list[str] = field(default_factory=list)
    calls: list[CallFragment] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def advance(self, delta: ChoiceDelta) -> list[int]:
        """The text_offsets of the delta's tokens in the choice's text."""
        self.finish_reason = delta.finish_reason or self.finish_reason
        return [self.base + offset for offset in delta.text_offsets]


class OpenAIResponder:
    """One response's translation. Use either chunks() per event (streaming) or add() per event
    then response() (a whole body), not both."""

    # A stream of chunks ends with `data: [DONE]`, also after an error chunk.
    ends_with_done = True

    def __init__(self, request: OpenAIRequest, response_id: str, created: int, model: str
                 ) -> None:
        self._request = request
        self._head = {"id": response_id, "object": "", "created": created, "model": model}
        self._choices: dict[int, _Choice] = {}
        self._usage: Usage | None = None
        # Each prompt's report (echo, prompt logprobs), by its index in a batch.
        self._prompts: dict[int, PromptReport] = {}
        # Continuous usage: each prompt's token count, and the tokens generated so far.
        self._prompt_tokens: dict[int, int] = {}
        self._completion_tokens = 0

    def chunks(self, event: GenerationEvent) -> list[dict]:
        """The chunks to send for `event`, zero or more."""
        chunks = []
        self._keep_prompt(event)
        for delta in event.choices:
            if delta.finish_reason == "error":
                continue
            self._completion_tokens += len(delta.token_ids)
            choice, delta = self._open(delta)
            if self._request.chat and not choice.role_sent:
                choice.role_sent = True
                chunks.append(self._chunk([{"index": delta.index,
                                            "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]))
            has_logprobs = self._request.logprobs and delta.logprobs
            read = _read(choice, delta)
            if not (read or has_logprobs or delta.finish_reason):
                continue
            offsets = choice.advance(delta)
            logprobs = self._logprobs(delta.logprobs, offsets) if has_logprobs else None
            if self._request.chat:
                body = {"delta": _chat_delta(read)}
            else:
                body = {"text": read.content}
            chunks.append(self._chunk([{"index": delta.index, **body, "logprobs": logprobs,
                                        "finish_reason": self._finish_reason(
                                            choice, delta.finish_reason)}]))
        if event.usage is not None and self._request.include_usage:
            chunks.append(self._chunk([], usage_object(event.usage)))
        return chunks

    def error_chunk(self, message: str, type_: str, param: str | None, code: str | None
                    ) -> dict:
        """The chunk that ends a stream that failed: OpenAI's error body."""
        return error_body(message, type_, param, code)

    def add(self, event: GenerationEvent) -> None:
        """Takes in `event` for the whole body."""
        self._keep_prompt(event)
        for delta in event.choices:
            if delta.finish_reason == "error":
                continue
            choice, delta = self._open(delta)
            read = _read(choice, delta)
            choice.offsets += choice.advance(delta)
            choice.texts.append(read.content)
            choice.calls += read.calls
            choice.logprobs += delta.logprobs
        if event.usage is not None:
            self._usage = event.usage

    def response(self) -> dict:
        """The whole body of the events added, choices by index."""
        choices = []
        for index in sorted(self._choices):
            choice = self._choices[index]
            text = "".join(choice.texts)
            body = ({"message": _message(text, choice.calls)} if self._request.chat
                    else {"text": text})
            choices.append({"index": index, **body,
                            "logprobs": self._logprobs(choice.logprobs, choice.offsets),
                            "finish_reason": self._finish_reason(choice,
                                                                 choice.finish_reason)})
            if self._request.prompt_logprobs and not self._request.chat:
                choices[-1]["prompt_logprobs"] = self._prompt_logprobs(index // self._n)
        response = {**self._head, "object": "chat.completion" if self._request.chat
                    else "text_completion", "choices": choices,
                    "usage": None if self._usage is None else usage_object(self._usage)}
        if self._request.prompt_logprobs and self._request.chat:
            response["prompt_logprobs"] = self._prompt_logprobs(0)
        return response

    @property
    def _n(self) -> int:
        return self._request.generation.sampling.n

    def _keep_prompt(self, event: GenerationEvent) -> None:
        if event.prompt_tokens:
            self._prompt_tokens[event.prompt_index] = event.prompt_tokens
        if event.prompt is not None:
            self._prompts[event.prompt_index] = event.prompt

    def _open(self, delta: ChoiceDelta) -> tuple[_Choice, ChoiceDelta]:
        """The delta's choice. Echoing, a new choice's first delta comes after its prompt."""
        fresh = delta.index not in self._choices
        choice = self._choice(delta.index)
        prompt = self._prompts.get(delta.index // self._n)
        if not (fresh and self._request.echo and prompt is not None):
            return choice, delta
        choice.base = len(prompt.text)
        # The prompt tokens' offsets, counted from the completion's start like the delta's.
        return choice, replace(
            delta, text=prompt.text + delta.text,
            logprobs=(prompt.logprobs or []) + delta.logprobs,
            text_offsets=[offset - choice.base for offset in prompt.text_offsets]
            + delta.text_offsets)

    def _prompt_logprobs(self, prompt_index: int) -> list[dict | None] | None:
        prompt = self._prompts.get(prompt_index)
        if prompt is None or prompt.logprobs is None:
            return None
        # The alternatives come best first: the i-th is ranked i + 1.
        return [None if entry.logprob is None else {
            str(token_id): {"logprob": _finite(logprob), "rank": rank, "decoded_token": text}
            for token_id, text, logprob, rank in [
                *((top.token_id, top.token, top.logprob, rank)
                  for rank, top in enumerate(entry.top, start=1)),
                (entry.token_id, entry.token, entry.logprob, entry.rank)]}
            for entry in prompt.logprobs]

    def _choice(self, index: int) -> _Choice:
        choice = self._choices.get(index)
        if choice is None:
            reader = self._request.tool_use.reader() if self._request.chat else None
            choice = self._choices[index] = _Choice(reader=reader)
        return choice

    def _finish_reason(self, choice: _Choice, reason: str | None) -> str | None:
        if reason == "stop" and choice.reader is not None and choice.reader.called:
            return self._request.tool_use.finish_reason_when_called
        return FINISH_REASONS[reason]

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        chunk = {**self._head, "object": "chat.completion.chunk" if self._request.chat
                 else "text_completion", "choices": choices}
        if self._request.include_usage:
            if usage is None and self._request.continuous_usage:
                prompt = sum(self._prompt_tokens.values())
                usage = {"prompt_tokens": prompt, "completion_tokens": self._completion_tokens,
                         "total_tokens": prompt + self._completion_tokens}
            chunk["usage"] = usage
        return chunk

    def _logprobs(self, entries: list[TokenLogprob], offsets: list[int]) -> dict | None:
        if not self._request.logprobs:
            return None
        if self._request.chat:
            return chat_logprobs(entries)
        return completion_logprobs(entries, offsets)


def _read(choice: _Choice, delta: ChoiceDelta) -> ReadOut:
    """The delta's text as content and tool-call fragments; on the choice's last delta, with
    whatever its reader still held back."""
    if choice.reader is None:
        return ReadOut(delta.text)
    read = choice.reader.feed(delta.text)
    if delta.finish_reason is not None:
        rest = choice.reader.finish()
        read.content += rest.content
        read.calls += rest.calls
    return read


def _chat_delta(read: ReadOut) -> dict:
    delta: dict = {"content": read.content} if read.content else {}
    if read.calls:
        delta["tool_calls"] = [
            {"index": fragment.index, "function": {"arguments": fragment.arguments}}
            if fragment.id is None else
            {"index": fragment.index, "id": fragment.id, "type": "function",
             "function": {"name": fragment.name, "arguments": fragment.arguments}}
            for fragment in read.calls]
    return delta


def _message(text: str, calls: list[CallFragment]) -> dict:
    if not calls:
        return {"role": "assistant", "content": text}
    # With calls, OpenAI's content is null unless the model also wrote text.
    return {"role": "assistant", "content": text or None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}
        for call in assemble(calls)]}


def completion_logprobs(entries: list[TokenLogprob], offsets: list[int]) -> dict:
    """The legacy object; a top_logprobs entry is {token text: logprob}. With no alternatives
    asked for (logprobs 0) it holds the chosen token alone, as vLLM's does, not an empty {}."""
    return {"tokens": [entry.token for entry in entries],
            "token_logprobs": [None if entry.logprob is None else _finite(entry.logprob)
                               for entry in entries],
            "top_logprobs": [_top_logprobs(entry) for entry in entries],
            "text_offset": offsets}


def _top_logprobs(entry: TokenLogprob) -> dict[str, float] | None:
    """{token text: logprob}; an echoed prompt's first token has none (null)."""
    if entry.logprob is None:
        return None
    top = {candidate.token: _finite(candidate.logprob) for candidate in entry.top}
    if entry.rank is not None or not top:   # a prompt token is listed among its alternatives
        top.setdefault(entry.token, _finite(entry.logprob))
    return top


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
