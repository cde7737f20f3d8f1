"""OpenAI /v1/completions and /v1/chat/completions request bodies (parsed JSON) as the gateway's
GenerationRequest. Pure translation: no HTTP, no I/O.

Supported, as OpenAI documents them: model, prompt (completions: a string, token ids, or an array
holding exactly one of those), messages (chat: roles system, user, assistant, tool, and
developer, read as system; content a string or an array of text parts), max_tokens (chat also
max_completion_tokens, which wins when both are given), n, temperature, top_p, presence_penalty,
frequency_penalty, seed, stop, logprobs (chat: a boolean with top_logprobs), stream,
stream_options.include_usage. Extensions, spelled as vLLM spells them: top_k (-1 or 0: off),
min_p, repetition_penalty, ignore_eos, stop_token_ids, skip_special_tokens, cache_salt,
add_generation_prompt (chat), and beam search as vLLM's server takes it: use_beam_search with n
as the width (all n hypotheses returned, best first), length_penalty and early_stopping (true,
false or "never", transformers' meanings). best_of (completions as OpenAI documents it, chat as
vLLM used to take it): sample best_of, return the n with the highest cumulative log-probability;
like beam search, its choices come whole at the end, also when streamed.

Defaults: model "" (the only model served), max_tokens 16 for completions (OpenAI's) and none for
chat (up to the context window), n 1, temperature 1, top_p 1, top_k off, min_p 0, penalties 0
(repetition_penalty 1), stream false, skip_special_tokens true, add_generation_prompt true.
A field set to null reads as not given.

Every other field OpenAI or vLLM defines is refused naming it, unless set to a value that asks
for nothing, or ignored where it changes nothing; a key neither defines is refused as OpenAI
refuses it. fields.py holds that list. Also refused here: content parts other than text, and
messages carrying tool_calls or function_call.

Only types are checked here, and the ranges that belong to the API (max_tokens >= 1,
top_logprobs 0..20). The other ranges depend on the model (vocabulary, context window) and are
checked by the core once it is known (SamplingParams.validate, GenerationRequest.check); their
messages start with the field's name, which `param_of` recovers for the error body.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.chat_template import ROLES
from gateway.generation_request import ChatMessage, GenerationRequest
from gateway.openai_http.fields import CHAT, COMPLETIONS, refused_field
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.sampling_params import DEFAULT_MAX_TOKENS, MAX_LOGPROBS, SamplingParams

# OpenAI's default for /v1/completions; chat has none.
COMPLETION_MAX_TOKENS = DEFAULT_MAX_TOKENS
# Prompts in one batched completions request: each is a request of its own to admission and
# the executors, so a bound keeps one HTTP request from queueing thousands.
MAX_BATCHED_PROMPTS = 256
# OpenAI's newer name for the system role; the templates know only the older one.
ROLE_ALIASES = {"developer": "system"}


class OpenAIParamError(InvalidArgument):
    """A request OpenAI's API would refuse, or that this gateway does not support. `param` names
    the JSON field as OpenAI's error body does ("temperature", "messages[2].content"); None for
    the body as a whole."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    # One per prompt: several for a batched completions prompt, whose choices are numbered
    # prompt by prompt (prompt i's choice j is index i * n + j), as OpenAI numbers them.
    generations: tuple[GenerationRequest, ...]
    stream: bool
    # stream_options.include_usage: a last chunk carries the usage (streaming only).
    include_usage: bool
    # /v1/chat/completions: selects the response shape.
    chat: bool
    # Whether the response carries logprobs objects (else null).
    logprobs: bool

    @property
    def generation(self) -> GenerationRequest:
        """The first (for a chat request, the only) prompt's generation."""
        return self.generations[0]


def parse_completion_request(body: object) -> OpenAIRequest:
    fields = _Fields(body, COMPLETIONS)
    prompts = _prompts(fields.required("prompt"))
    logprobs = fields.get("logprobs", None, "integer")
    max_tokens = _max_tokens(fields, "max_tokens", COMPLETION_MAX_TOKENS)
    common = _common(fields, logprobs)
    generations = tuple(GenerationRequest(text=text, token_ids=token_ids, max_tokens=max_tokens,
                                          **common) for text, token_ids in prompts)
    return _request(fields, generations, chat=False, logprobs=logprobs is not None)


def parse_chat_request(body: object) -> OpenAIRequest:
    fields = _Fields(body, CHAT)
    messages = parse_messages(fields.required("messages"))
    logprobs = fields.get("logprobs", False, "boolean")
    top_logprobs = fields.get("top_logprobs", None, "integer")
    if top_logprobs is not None:
        if not logprobs:
            raise OpenAIParamError("top_logprobs requires logprobs to be true", "top_logprobs")
        if not 0 <= top_logprobs <= MAX_LOGPROBS:
            raise OpenAIParamError(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got "
                                   f"{top_logprobs}", "top_logprobs")
    max_completion_tokens = _max_tokens(fields, "max_completion_tokens", None)
    max_tokens = _max_tokens(fields, "max_tokens", None)
    generation = GenerationRequest(
        chat=messages, add_generation_prompt=fields.get("add_generation_prompt", True, "boolean"),
        max_tokens=max_tokens if max_completion_tokens is None else max_completion_tokens,
        **_common(fields, (top_logprobs or 0) if logprobs else None))
    return _request(fields, (generation,), chat=True, logprobs=logprobs)


# Fields a later check's message may start with (SamplingParams.validate,
# GenerationRequest.check, chat_template.validate_messages, Generator.model, prompt.py).
KNOWN_PARAMS = frozenset({
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "temperature",
    "top_p", "top_k", "min_p", "seed", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "stop", "stop_token_ids", "logprobs", "top_logprobs", "cache_salt",
    "length_penalty", "early_stopping", "best_of"})
_LEADING_FIELD = re.compile(r"([a-z_]+)(?:\[\d+\]|\.[a-z_]+)*")


def param_of(message: str) -> str | None:
    """The field a validation message starts with, for errors the core raises after parsing:
    "top_p must be in (0, 1], got 1.5" → "top_p", "messages[2].role must be ..." →
    "messages[2].role"; None when the message starts with no known field."""
    match = _LEADING_FIELD.match(message)
    if match is None or match.group(1) not in KNOWN_PARAMS:
        return None
    return match.group(0)


class _Fields:
    """Typed reads of a request body's fields: null reads as not given, a wrong type is refused
    naming the field, and so is a field this endpoint does not implement (fields.py)."""

    def __init__(self, body: object, endpoint: str) -> None:
        body = json_object(body)
        refusal = refused_field(body, endpoint)
        if refusal is not None:
            raise OpenAIParamError(*refusal)
        self._body = body

    def required(self, name: str) -> Any:
        value = self._body.get(name)
        if value is None:
            raise OpenAIParamError(f"{name} is required", name)
        return value

    def get(self, name: str, default: Any, *kinds: str) -> Any:
        value = self._body.get(name)
        return default if value is None else expect(value, name, *kinds)

    def number(self, name: str, default: float) -> float:
        return float(self.get(name, default, "number"))


def json_object(body: object) -> dict[str, Any]:
    """`body` if it is a JSON object; every endpoint's body must be one."""
    if not isinstance(body, dict):
        raise OpenAIParamError(
            f"the request body must be a JSON object, got {_a(_json_type(body))}")
    return body


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):      # before int: bool is an int to Python, not to JSON
        return "boolean"
    for kind, python in (("integer", int), ("number", float), ("string", str),
                         ("array", list), ("object", dict)):
        if isinstance(value, python):
            return kind
    return type(value).__name__


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def expect(value: Any, param: str, *kinds: str) -> Any:
    """`value` if its JSON type is one of `kinds` (an integer is a number too)."""
    kind = _json_type(value)
    if kind in kinds or (kind == "integer" and "number" in kinds):
        return value
    raise OpenAIParamError(f"{param} must be {' or '.join(map(_a, kinds))}, got {_a(kind)}",
                           param)


def _prompts(value: Any) -> list[tuple[str | None, tuple[int, ...] | None]]:
    """`prompt` as one (text, token ids) per prompt, one of the two set: a string, token ids,
    or an array of those (a batch)."""
    expect(value, "prompt", "string", "array")
    if isinstance(value, list) and value and all(isinstance(item, (str, list))
                                                 for item in value):
        if len(value) > MAX_BATCHED_PROMPTS:
            raise OpenAIParamError(f"prompt: at most {MAX_BATCHED_PROMPTS} prompts in one "
                                   f"request, got {len(value)}", "prompt")
        return [_prompt(item, f"prompt[{index}]") for index, item in enumerate(value)]
    return [_prompt(value, "prompt")]


def _prompt(value: Any, where: str) -> tuple[str | None, tuple[int, ...] | None]:
    if not value:
        raise OpenAIParamError(f"{where} must not be empty", "prompt")
    if isinstance(value, str):
        return value, None
    for item in value:
        if _json_type(item) != "integer":
            raise OpenAIParamError(
                f"{where} must be a string, an array of integer token ids, or an array of "
                f"those; found {_a(_json_type(item))} among the token ids", "prompt")
    return None, tuple(value)


def parse_messages(value: Any) -> tuple[ChatMessage, ...]:
    expect(value, "messages", "array")
    if not value:
        raise OpenAIParamError("messages must hold at least one message", "messages")
    return tuple(_message(message, f"messages[{index}]") for index, message in enumerate(value))


def _message(message: Any, where: str) -> ChatMessage:
    expect(message, where, "object")
    if message.get("role") is None:
        raise OpenAIParamError(f"{where}.role is required", f"{where}.role")
    role = expect(message["role"], f"{where}.role", "string")
    role = ROLE_ALIASES.get(role, role)
    if role not in ROLES:
        raise OpenAIParamError(f"{where}.role must be one of {', '.join(ROLES)}, "
                               f"{', '.join(ROLE_ALIASES)}; got {message['role']!r}",
                               f"{where}.role")
    for key, what in (("tool_calls", "tool calls"), ("function_call", "function calls")):
        if message.get(key):
            raise OpenAIParamError(f"{where}.{key}: {what} are not supported", f"{where}.{key}")
    content = message.get("content")
    if content is None:
        if role != "assistant":
            raise OpenAIParamError(f"{where}.content is required (only assistant messages may "
                                   "leave it null)", f"{where}.content")
        return ChatMessage(role, "")
    return ChatMessage(role, _content(content, f"{where}.content"))


def _content(content: Any, where: str) -> str:
    """A message's content: a string, or the texts of its text parts joined."""
    if isinstance(expect(content, where, "string", "array"), str):
        return content
    texts = []
    for index, part in enumerate(content):
        here = f"{where}[{index}]"
        expect(part, here, "object")
        if part.get("type") != "text":
            raise OpenAIParamError(f"{here}: only text parts are supported, got type "
                                   f"{part.get('type')!r}", here)
        texts.append(expect(part.get("text"), f"{here}.text", "string"))
    return "".join(texts)


def _max_tokens(fields: _Fields, name: str, default: int | None) -> int | None:
    value = fields.get(name, None, "integer")
    if value is None:
        return default
    if value < 1:
        raise OpenAIParamError(f"{name} must be >= 1, got {value}", name)
    return value


def _common(fields: _Fields, logprobs: int | None) -> dict[str, Any]:
    """GenerationRequest's fields that both endpoints read alike."""
    stop = fields.get("stop", (), "string", "array")
    if isinstance(stop, str):
        stop = (stop,)
    return dict(model=fields.get("model", "", "string"),
                sampling=_sampling(fields, logprobs),
                stop=tuple(expect(s, f"stop[{i}]", "string") for i, s in enumerate(stop)),
                cache_salt=fields.get("cache_salt", "", "string"),
                keep_special_tokens=not fields.get("skip_special_tokens", True, "boolean"))


def _sampling(fields: _Fields, logprobs: int | None) -> SamplingParams:
    top_k = fields.get("top_k", 0, "integer")
    stop_token_ids = fields.get("stop_token_ids", [], "array")
    n = fields.get("n", 1, "integer")
    early_stopping = fields.get("early_stopping", False, "boolean", "string")
    if isinstance(early_stopping, str) and early_stopping != "never":
        raise OpenAIParamError(f'early_stopping must be true, false or "never", got '
                               f"{early_stopping!r}", "early_stopping")
    return SamplingParams(
        n=n,
        beam_width=n if fields.get("use_beam_search", False, "boolean") else 0,
        best_of=fields.get("best_of", None, "integer"),
        length_penalty=fields.number("length_penalty", 1.0),
        early_stopping=early_stopping,
        temperature=fields.number("temperature", 1.0),
        top_k=0 if top_k == -1 else top_k,    # vLLM's "off"; SamplingParams knows only 0
        top_p=fields.number("top_p", 1.0),
        min_p=fields.number("min_p", 0.0),
        seed=fields.get("seed", None, "integer"),
        repetition_penalty=fields.number("repetition_penalty", 1.0),
        presence_penalty=fields.number("presence_penalty", 0.0),
        frequency_penalty=fields.number("frequency_penalty", 0.0),
        stop_token_ids=tuple(expect(token, f"stop_token_ids[{index}]", "integer")
                             for index, token in enumerate(stop_token_ids)),
        ignore_eos=fields.get("ignore_eos", False, "boolean"),
        logprobs=logprobs)


def _request(fields: _Fields, generations: tuple[GenerationRequest, ...], chat: bool,
             logprobs: bool) -> OpenAIRequest:
    stream = fields.get("stream", False, "boolean")
    options = fields.get("stream_options", None, "object")
    if options is not None and not stream:
        raise OpenAIParamError("stream_options is only allowed when stream is true",
                               "stream_options")
    usage = (options or {}).get("include_usage")
    include_usage = usage is not None and expect(usage, "stream_options.include_usage",
                                                  "boolean")
    return OpenAIRequest(generations, stream=stream, include_usage=include_usage, chat=chat,
                         logprobs=logprobs)
