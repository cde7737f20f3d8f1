"""Chat messages -> prompt text, rendered with the model's Jinja chat template exactly as
transformers' `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` does.

The template comes from the tokenizer files an executor serves, in transformers 5's order:
`chat_template.jinja`, else `chat_template` in `tokenizer_config.json` (a string, or a list of
{name, template} of which "default" is used; a list without one counts as no template), else the
legacy `chat_template.json`.

A model that ships no template gets DEFAULT_CHAT_TEMPLATE, ChatML:
`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, and `<|im_start|>assistant\\n` as the
generation prompt. transformers refuses to chat with such a model; we serve it so a base model
still answers chat requests, and `ChatTemplate.is_default` tells the caller it happened.

Templates are code from the Hub run on user input, so they run in Jinja's immutable sandbox with
the globals transformers offers (`raise_exception`, `strftime_now`, a non-escaping `tojson`, a
`namespace` that refuses underscore names) and its default lenient `Undefined`: `{{ missing }}`
renders as nothing and `{% if tools %}` is false, which Hub templates rely on, while
`{{ missing.attr }}` fails. Strict undefined would reject templates that transformers renders.

Messages are validated before rendering: the role one of ROLES, the content a string,
`tool_calls` (assistant) a list of objects, shaped as transformers documents them:
{"id", "type": "function", "function": {"name", "arguments": {...}}}. Any other key must hold a
string (`name`, `tool_call_id`) and is handed to the template as is.

Tools reach the template as transformers passes them: `tools` is the list of OpenAI function
definitions, or None. A model whose tokenizer_config.json holds named templates renders a
request with tools with its "tool_use" template when it has one, as transformers does.

Errors: `ChatTemplateError` for a template that does not compile or fails while rendering (its
`raise_exception` message verbatim), and its subclass `InvalidMessage` for malformed messages,
naming the message index and field. Both are the client's request failing: they are
`InvalidArgument`s, so the error interceptor answers INVALID_ARGUMENT with their text.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pagedserve.common.errors import InvalidArgument

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# OpenAI's chat roles; templates that know fewer refuse the rest with raise_exception.
ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(InvalidArgument, ValueError):
    """The chat request cannot be rendered into a prompt. A ValueError to Python callers,
    INVALID_ARGUMENT on the wire."""


class InvalidMessage(ChatTemplateError):
    """A message is malformed; the text names its index and field."""


class _TemplateRaised(jinja2.TemplateError):
    # Kept apart from Jinja's own errors so the template author's message reaches the client bare.
    pass


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str
    # Template variables beside `messages`: bos_token, eos_token, ... as plain strings.
    special_tokens: Mapping[str, str]
    # True when the model has no template of its own and DEFAULT_CHAT_TEMPLATE stands in.
    is_default: bool
    # The model's "tool_use" template, for requests with tools, when it names one apart.
    tool_use_source: str | None = None

    @classmethod
    def from_files(cls, files: Mapping[str, bytes], special_tokens: Mapping[str, str]
                   ) -> ChatTemplate:
        source = template_source(files)
        if source is None:
            return cls(DEFAULT_CHAT_TEMPLATE, dict(special_tokens), is_default=True)
        return cls(source, dict(special_tokens), is_default=False,
                   tool_use_source=template_source(files, "tool_use"))

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        checked = validate_messages(messages)
        source = self.source if tools is None else self.tool_use_source or self.source
        template = compile_template(source)
        try:
            # No tools and no documents are passed as None like transformers does, for
            # templates that test `tools is not none`.
            return template.render(**self.special_tokens, messages=checked,
                                   tools=None if tools is None else list(tools),
                                   documents=None, add_generation_prompt=add_generation_prompt)
        except _TemplateRaised as error:
            raise ChatTemplateError(str(error.message)) from None
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template failed: {error}") from None
        except Exception as error:  # noqa: BLE001 - a template can fail in any Python operation
            raise ChatTemplateError(
                f"chat template failed: {type(error).__name__}: {error}") from None


def template_source(files: Mapping[str, bytes], name: str = "default") -> str | None:
    """The model's chat template text, or None when it has none. `name` picks among named
    templates; only tokenizer_config.json names them."""
    config = json.loads(files.get("tokenizer_config.json", b"{}"))
    template = config.get("chat_template")
    if name != "default":
        return next((entry["template"] for entry in template if entry.get("name") == name),
                    None) if isinstance(template, list) else None
    if "chat_template.jinja" in files:
        return files["chat_template.jinja"].decode("utf-8")
    if isinstance(template, list):
        # Named templates (e.g. "default" and "tool_use"); chat without tools uses "default".
        template = next((entry["template"] for entry in template
                         if entry.get("name") == "default"), None)
    if template is None and "chat_template.json" in files:
        template = json.loads(files["chat_template.json"]).get("chat_template")
    return template


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain copies of the messages, so the template sees only dicts of strings (and the
    plain lists and dicts of `tool_calls`)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise InvalidMessage(f"messages must be a list, got {type(messages).__name__}")
    if not messages:
        raise InvalidMessage("messages must not be empty")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidMessage(
                f"messages[{index}] must be an object, got {type(message).__name__}")
        for field in ("role", "content"):
            if message.get(field) is None:
                raise InvalidMessage(f"messages[{index}] has no {field}")
        # transformers drops None-valued keys (OpenAI clients send `name: null`); so do we.
        plain = {key: value for key, value in message.items() if value is not None}
        if "tool_calls" in plain:
            plain["tool_calls"] = _tool_calls(plain["tool_calls"], index)
        for key, value in plain.items():
            if key == "tool_calls":
                continue
            if not isinstance(key, str) or type(value) is not str:
                raise InvalidMessage(
                    f"messages[{index}].{key} must be a string, got {type(value).__name__}")
        if plain["role"] not in ROLES:
            raise InvalidMessage(f"messages[{index}].role must be one of {', '.join(ROLES)}; "
                                 f"got {plain['role']!r}")
        checked.append(plain)
    return checked


def _tool_calls(calls: Any, index: int) -> list[dict[str, Any]]:
    # Deep plain copies: JSON-like values only, so the template cannot reach other objects.
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise InvalidMessage(f"messages[{index}].tool_calls must be a list, got "
                             f"{type(calls).__name__}")
    for number, call in enumerate(calls):
        if not isinstance(call, Mapping):
            raise InvalidMessage(f"messages[{index}].tool_calls[{number}] must be an object, "
                                 f"got {type(call).__name__}")
    try:
        return json.loads(json.dumps(list(calls)))
    except (TypeError, ValueError) as error:
        raise InvalidMessage(f"messages[{index}].tool_calls must hold JSON values: {error}"
                             ) from None


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; prompts want the JSON as written, and
    # non-ASCII kept, as transformers renders it.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Namespace(jinja2.utils.Namespace):
    # As in transformers: no dunder or private attributes stored on a namespace, which would
    # open paths toward CPython internals.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}")


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["namespace"] = _Namespace
    return environment


_ENVIRONMENT = _environment()


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compiled once per template text; a gateway sees a handful of models."""
    try:
        return _ENVIRONMENT.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(
            f"chat template does not compile: {error.message} (line {error.lineno})") from None
