"""A chat choice's text read as OpenAI tool calls, delta by delta: which text is content and
which calls a function. Pure: text in, content and call fragments out.

How the text is read depends on the request's `tool_choice` (ToolUse):

    auto       the model writes freely in the Hermes / Qwen 2.5 format: a call is a block
               `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, anything else is
               content (HermesCallReader)
    function   the grammar made the whole text the named function's arguments object
               (NamedCallReader)
    required   the grammar made the whole text a JSON array of {"name", "parameters"} objects,
               one per call (RequiredCallsReader)
    none       no reader: every character is content

Streamed, content goes out as soon as it cannot be part of a call. An auto call goes out whole,
once its block closes; a named call's arguments go out as they come; required calls go out at
the end, when the array can be parsed. Reading the whole text at once gives the same content and
calls as reading it in any pieces.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Literal, Protocol

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ToolChoiceMode = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True, slots=True)
class ToolUse:
    """What a chat request's tools ask of its answer."""
    mode: ToolChoiceMode
    # mode "function": the function every answer calls.
    function: str = ""
    # parallel_tool_calls: false keeps one call at most.
    parallel: bool = True

    @property
    def finish_reason_when_called(self) -> str:
        # vLLM's (and OpenAI's) words: "tool_calls" when the model chose to call, "stop" when
        # the request named the function.
        return "stop" if self.mode == "function" else "tool_calls"

    def reader(self) -> CallReader | None:
        """A new reader for one choice's text; None when all of it is content."""
        max_calls = None if self.parallel else 1
        if self.mode == "auto":
            return HermesCallReader(max_calls)
        if self.mode == "function":
            return NamedCallReader(self.function)
        if self.mode == "required":
            return RequiredCallsReader(max_calls)
        return None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call, as OpenAI carries it: the arguments are a JSON object as text."""
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class CallFragment:
    # The call's position in the choice's tool_calls.
    index: int
    arguments: str
    # Set on a call's first fragment only; later fragments extend its arguments.
    id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class ReadOut:
    """What one piece of text turned out to hold."""
    content: str = ""
    calls: list[CallFragment] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


class CallReader(Protocol):
    def feed(self, text: str) -> ReadOut: ...

    def finish(self) -> ReadOut:
        """Whatever is still held back, once the text is complete."""
        ...

    @property
    def called(self) -> bool:
        """Whether the text made at least one call."""
        ...


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def assemble(fragments: list[CallFragment]) -> list[ToolCall]:
    """The calls that fragments (in order) add up to."""
    parts: dict[int, list[str]] = {}
    heads: dict[int, CallFragment] = {}
    for fragment in fragments:
        if fragment.id is not None:
            heads[fragment.index] = fragment
        parts.setdefault(fragment.index, []).append(fragment.arguments)
    return [ToolCall(heads[index].id, heads[index].name, "".join(parts[index]))
            for index in sorted(heads)]


class HermesCallReader:
    """`<tool_call>` blocks in free text. A block whose body is not a JSON object with a string
    `name` and an object `arguments` stays in the content as written, and so does a block the
    text ends inside. Whitespace around a parsed call is the format's layout, not content: it is
    dropped, so a text of calls alone has no content at all.

    Held back while streaming: a tail that may be the start of `<tool_call>`, trailing
    whitespace (it goes if a call follows), and an open block's body."""

    def __init__(self, max_calls: int | None = None) -> None:
        self._max_calls = max_calls
        self._pending = ""          # text not yet given out
        self._in_block = False
        self._space_before = ""     # the whitespace before the open block's tag
        self._after_call = False    # whitespace right after a parsed call is dropped
        self._calls = 0

    @property
    def called(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> ReadOut:
        self._pending += text
        out = ReadOut()
        while True:
            if self._in_block:
                end = self._pending.find(CALL_CLOSE)
                if end < 0:
                    return out
                self._close_block(self._pending[:end], out)
                self._pending = self._pending[end + len(CALL_CLOSE):]
                continue
            if self._after_call:
                stripped = self._pending.lstrip()
                if not stripped:
                    self._pending = ""
                    return out
                self._pending, self._after_call = stripped, False
            start = self._pending.find(CALL_OPEN)
            if start < 0:
                sendable = _sendable(self._pending)
                out.content += self._pending[:sendable]
                self._pending = self._pending[sendable:]
                return out
            before = self._pending[:start]
            text_part = before.rstrip()
            out.content += text_part
            self._space_before = before[len(text_part):]
            self._pending = self._pending[start + len(CALL_OPEN):]
            self._in_block = True

    def finish(self) -> ReadOut:
        # An unclosed block is content; whitespace after a call was never kept in _pending.
        held = (self._space_before + CALL_OPEN + self._pending if self._in_block
                else self._pending)
        self._pending, self._in_block = "", False
        return ReadOut(held)

    def _close_block(self, body: str, out: ReadOut) -> None:
        self._in_block = False
        call = _hermes_call(body)
        if call is None:
            out.content += self._space_before + CALL_OPEN + body + CALL_CLOSE
            return
        # A parsed call swallows the whitespace around it; one over max_calls is dropped whole
        # (vLLM keeps the first call when parallel_tool_calls is false).
        self._after_call = True
        if self._max_calls is None or self._calls < self._max_calls:
            name, arguments = call
            out.calls.append(CallFragment(self._calls, arguments, new_call_id(), name))
            self._calls += 1


def _sendable(text: str) -> int:
    """How much of `text` can go out as content now: not a tail that may begin `<tool_call>`,
    nor the whitespace before it, which a call would drop."""
    keep = len(text)
    for length in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-length:]):
            keep -= length
            break
    return len(text[:keep].rstrip())


def _hermes_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) from a block's body, None if it is not a call."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)
            and isinstance(value.get("arguments"), dict)):
        return None
    return value["name"], json.dumps(value["arguments"], ensure_ascii=False)


class NamedCallReader:
    """The whole text is the arguments of the named function: one call, opened by the first
    piece and extended by each later one."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._opened = False

    @property
    def called(self) -> bool:
        return self._opened

    def feed(self, text: str) -> ReadOut:
        if self._opened:
            return ReadOut(calls=[CallFragment(0, text)] if text else [])
        self._opened = True
        return ReadOut(calls=[CallFragment(0, text, new_call_id(), self._name)])

    def finish(self) -> ReadOut:
        return ReadOut() if self._opened else self.feed("")


class RequiredCallsReader:
    """The whole text is a JSON array of {"name", "parameters"} objects, one per call. It is
    read once complete; text that is not such an array (cut short by max_tokens) is content."""

    def __init__(self, max_calls: int | None = None) -> None:
        self._max_calls = max_calls
        self._text: list[str] = []
        self._calls = 0

    @property
    def called(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> ReadOut:
        self._text.append(text)
        return ReadOut()

    def finish(self) -> ReadOut:
        text, self._text = "".join(self._text), []
        calls = _required_calls(text)
        if calls is None:
            return ReadOut(content=text)
        calls = calls[:self._max_calls]
        self._calls = len(calls)
        return ReadOut(calls=[CallFragment(index, arguments, new_call_id(), name)
                              for index, (name, arguments) in enumerate(calls)])


def _required_calls(text: str) -> list[tuple[str, str]] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not value:
        return None
    calls = []
    for item in value:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                and isinstance(item.get("parameters"), dict)):
            return None
        calls.append((item["name"], json.dumps(item["parameters"], ensure_ascii=False)))
    return calls
