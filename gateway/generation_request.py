"""What a client asks the gateway for, as one domain object whichever API it came through
(gRPC Generate, HTTP /v1/completions or /v1/chat/completions), and the field checks that do not
depend on the model. Checks that do (vocabulary, context window) happen once the prompt is
tokenized (gateway/prompt.py)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.tool_calls import ToolCall
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.sampling_params import SamplingParams

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 64
MAX_CACHE_SALT_CHARS = 256
MAX_PROMPT_CHARS = 4 << 20


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    # An assistant message's calls (HTTP only; the gRPC API has no tools).
    tool_calls: tuple[ToolCall, ...] = ()
    # A tool message: the call it answers.
    tool_call_id: str = ""
    # The author's name (OpenAI's `name`), for templates that show it.
    name: str = ""

    def template_message(self) -> dict[str, Any]:
        """The message as a chat template reads it, shaped as transformers documents it: each
        call's arguments a dict, not OpenAI's JSON text (vLLM converts them the same way, and
        reads arguments that are not a JSON object as {} so that a bad call in the history does
        not fail every later turn of the conversation)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": _arguments(call.arguments)}}
                for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.name:
            message["name"] = self.name
        return message


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    model: str
    # Exactly one of the three prompt forms is set.
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    chat: tuple[ChatMessage, ...] | None = None
    add_generation_prompt: bool = True
    # The chat template's `tools`: OpenAI's function definitions; None when the request has
    # none (HTTP only).
    tools: tuple[Mapping[str, Any], ...] | None = None
    # max_tokens None (in `max_tokens`): up to the context window.
    sampling: SamplingParams = SamplingParams()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    cache_salt: str = ""
    keep_special_tokens: bool = False
    # The first event carries the prompt (its text and tokens), to be returned before the
    # completion (completions' `echo`).
    echo: bool = False

    def check(self) -> None:
        """Raises InvalidArgument naming the first bad field (`field` as the API spells it)."""
        forms = sum(form is not None for form in (self.text, self.token_ids, self.chat))
        _check(forms == 1, "prompt: give exactly one of text, token ids or chat messages")
        if self.text is not None:
            _check(self.text != "", "prompt must not be empty")
            _check_utf8(self.text, "prompt")
            _check(len(self.text) <= MAX_PROMPT_CHARS,
                   f"prompt has {len(self.text)} characters, more than {MAX_PROMPT_CHARS}")
        if self.token_ids is not None:
            _check(len(self.token_ids) > 0, "prompt token ids must not be empty")
        if self.chat is not None:
            # Roles and contents are checked where the template renders them
            # (gateway/chat_template.py validate_messages), naming the message.
            _check(len(self.chat) > 0, "messages must hold at least one message")
            for index, message in enumerate(self.chat):
                _check_utf8(message.content, f"messages[{index}].content")
                for number, call in enumerate(message.tool_calls):
                    _check_utf8(call.name + call.arguments,
                                f"messages[{index}].tool_calls[{number}].function")
        if self.tools is not None:
            _check_utf8(json.dumps(self.tools, ensure_ascii=False), "tools")
        # 0 generates nothing: only what is returned of the prompt makes it worth asking.
        _check(self.max_tokens is None or self.max_tokens >= 1 or (
            self.max_tokens == 0 and (self.echo or self.sampling.prompt_logprobs is not None)),
            max_tokens_refusal("max_tokens", self.max_tokens))
        _check(len(self.stop) <= MAX_STOP_STRINGS,
               f"stop holds {len(self.stop)} strings, at most {MAX_STOP_STRINGS} are allowed")
        for index, stop in enumerate(self.stop):
            _check(1 <= len(stop) <= MAX_STOP_STRING_CHARS,
                   f"stop[{index}] must be 1 to {MAX_STOP_STRING_CHARS} characters, "
                   f"got {len(stop)}")
            _check_utf8(stop, f"stop[{index}]")
        _check(len(self.cache_salt) <= MAX_CACHE_SALT_CHARS,
               f"cache_salt must be at most {MAX_CACHE_SALT_CHARS} characters")


def max_tokens_refusal(name: str, value: int) -> str:
    return (f"{name} must be >= 1, or 0 to score or echo the prompt without generating "
            f"(with prompt_logprobs or echo), got {value}")


def _check_utf8(text: str, name: str) -> None:
    """JSON can carry lone surrogates (\\ud800) that no UTF-8 tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidArgument(f"{name} is not valid Unicode: a lone surrogate "
                              f"{text[error.start]!r} at character {error.start}") from None


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidArgument(message)
