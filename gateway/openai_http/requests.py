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
like beam search, its choices come whole at the end, also when streamed. Structured output
(response_format, structured_outputs, guided_json / _regex / _choice / _grammar), logit_bias
and allowed_token_ids: structured_fields.py.

Defaults: model "" (the only model served), max_tokens 16 for completions (OpenAI's) and none for
chat (up to the context window), n 1, temperature 1, top_p 1, top_k off, min_p 0, penalties 0
(repetition_penalty 1), stream false, skip_special_tokens true, add_generation_prompt true.
A field set to null reads as not given.

Every other field OpenAI or vLLM defines is refused naming it, unless set to a value that asks
for nothing, or ignored where it changes nothing; a key neither defines is refused as OpenAI
refuses it. fields.py holds that list. Also refused here: content parts other than text, and
messages carrying the deprecated function_call.

Chat tools (tools.py): tools, tool_choice and parallel_tool_calls; an assistant message's
tool_calls and a tool message's tool_call_id go to the chat template.

Only types are checked here, and the ranges that belong to the API (max_tokens >= 1,
top_logprobs 0..20). The other ranges depend on the model (vocabulary, context window) and are
checked by the core once it is known (SamplingParams.validate, GenerationRequest.check); their
messages start with the field's name, which `param_of` recovers for the error body.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from gateway.chat_template import ROLES
from gateway.generation_request import ChatMessage, GenerationRequest, max_tokens_refusal
from gateway.openai_http.fields import CHAT, COMPLETIONS, refused_field
from gateway.openai_http.json_values import OpenAIParamError, a_json, expect, json_object, json_type
from gateway.openai_http.structured_fields import (parse_allowed_token_ids, parse_logit_bias,
                                                   parse_structured)
from gateway.openai_http.tools import NO_TOOLS, history_tool_calls, parse_tools
from gateway.tool_calls import ToolCall, ToolUse
from pagedserve.protocol.sampling_params import DEFAULT_MAX_TOKENS, MAX_LOGPROBS, SamplingParams

# OpenAI's default for /v1/completions; chat has none.
COMPLETION_MAX_TOKENS = DEFAULT_MAX_TOKENS
# Prompts in one batched completions request: each is a request of its own to admission and
# the executors, so a bound keeps one HTTP request from queueing thousands.
MAX_BATCHED_PROMPTS = 256
# OpenAI's newer name for the system role; the templates know only the older one.
ROLE_ALIASES = {"developer": "system"}


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
    # Completions: each choice's text (and logprobs) start with the prompt's.
    echo: bool = False
    # vLLM's prompt_logprobs field: the response carries the prompt's scores in its shape.
    prompt_logprobs: bool = False
    # stream_options.continuous_usage_stats (vLLM's, with include_usage): every chunk carries
    # the usage so far.
    continuous_usage: bool = False
    # Chat: how the answer's text is read for tool calls.
    tool_use: ToolUse = NO_TOOLS.use

    @property
    def generation(self) -> GenerationRequest:
        """The first (for a chat request, the only) prompt's generation."""
        return self.generations[0]


def parse_completion_request(body: object) -> OpenAIRequest:
    fields = _Fields(body, COMPLETIONS)
    prompts = _prompts(fields.required("prompt"))
    logprobs = fields.get("logprobs", None, "integer")
    max_tokens = _max_tokens(fields, "max_tokens", COMPLETION_MAX_TOKENS)
    echo = fields.get("echo", False, "boolean")
    common = _common(fields, logprobs)
    prompt_logprobs = _prompt_logprobs(fields)
    # Echoing with logprobs scores the echoed prompt too (at the same number of alternatives,
    # unless prompt_logprobs says), as vLLM does: that is how lm-eval scores continuations.
    scored = logprobs if prompt_logprobs is None and echo else prompt_logprobs
    common["sampling"] = replace(common["sampling"], prompt_logprobs=scored)
    generations = tuple(GenerationRequest(text=text, token_ids=token_ids, max_tokens=max_tokens,
                                          echo=echo, **common) for text, token_ids in prompts)
    return replace(_request(fields, generations, chat=False, logprobs=logprobs is not None),
                   echo=echo, prompt_logprobs=prompt_logprobs is not None)


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
    common = _common(fields, (top_logprobs or 0) if logprobs else None)
    prompt_logprobs = _prompt_logprobs(fields)
    common["sampling"] = replace(common["sampling"], prompt_logprobs=prompt_logprobs)
    generation = GenerationRequest(
        chat=messages, add_generation_prompt=fields.get("add_generation_prompt", True, "boolean"),
        max_tokens=max_tokens if max_completion_tokens is None else max_completion_tokens,
        **common)
    generation, tool_use = _with_tools(fields, generation)
    return replace(_request(fields, (generation,), chat=True, logprobs=logprobs),
                   prompt_logprobs=prompt_logprobs is not None, tool_use=tool_use)


def _with_tools(fields: _Fields, generation: GenerationRequest
                ) -> tuple[GenerationRequest, ToolUse]:
    """The generation with the request's tools for its template, and for `required` or a named
    function its output held to the calls' schema."""
    tools = parse_tools(fields.get("tools", None, "array"),
                        fields.get("tool_choice", None, "string", "object"),
                        fields.get("parallel_tool_calls", None, "boolean"))
    sampling = generation.sampling
    if tools.constraint is not None:
        if sampling.structured is not None:
            raise OpenAIParamError(f'tool_choice {tools.use.mode!r} holds the output to its '
                                   "calls; it does not combine with another structured output "
                                   "(response_format, structured_outputs, guided_*)",
                                   "tool_choice")
        sampling = replace(sampling, structured=tools.constraint)
    return replace(generation, tools=tools.definitions, sampling=sampling), tools.use


def _prompt_logprobs(fields: _Fields) -> int | None:
    """vLLM's prompt_logprobs: how many alternatives to report per prompt token."""
    value = fields.get("prompt_logprobs", None, "integer")
    if value is None:
        return None
    if value == -1:
        raise OpenAIParamError(f"prompt_logprobs -1 (the whole vocabulary) is not supported: "
                               f"at most {MAX_LOGPROBS} alternatives", "prompt_logprobs")
    if fields.get("stream", False, "boolean"):
        # They would all go out in the first chunk, which vLLM refuses to do.
        raise OpenAIParamError("prompt_logprobs are not available when stream is true",
                               "prompt_logprobs")
    return value


# Fields a later check's message may start with (SamplingParams.validate,
# GenerationRequest.check, chat_template.validate_messages, Generator.model, prompt.py).
KNOWN_PARAMS = frozenset({
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "temperature",
    "top_p", "top_k", "min_p", "seed", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "stop", "stop_token_ids", "logprobs", "top_logprobs", "cache_salt",
    "length_penalty", "early_stopping", "best_of", "prompt_logprobs", "tools", "logit_bias",
    "allowed_token_ids"})
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
        if json_type(item) != "integer":
            raise OpenAIParamError(
                f"{where} must be a string, an array of integer token ids, or an array of "
                f"those; found {a_json(json_type(item))} among the token ids", "prompt")
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
    if message.get("function_call"):
        raise OpenAIParamError(f"{where}.function_call: the deprecated function calls are not "
                               "supported; send tool_calls", f"{where}.function_call")
    calls: tuple[ToolCall, ...] = ()
    if message.get("tool_calls"):
        if role != "assistant":
            raise OpenAIParamError(f"{where}.tool_calls: only assistant messages carry tool "
                                   "calls", f"{where}.tool_calls")
        calls = history_tool_calls(message["tool_calls"], f"{where}.tool_calls")
    extras = {key: expect(message[key], f"{where}.{key}", "string")
              for key in ("tool_call_id", "name") if message.get(key) is not None}
    content = message.get("content")
    if content is None:
        if role != "assistant":
            raise OpenAIParamError(f"{where}.content is required (only assistant messages may "
                                   "leave it null)", f"{where}.content")
        return ChatMessage(role, "", calls, **extras)
    return ChatMessage(role, _content(content, f"{where}.content"), calls, **extras)


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
    if value < 0:   # 0 is for scoring or echoing the prompt: GenerationRequest.check
        raise OpenAIParamError(max_tokens_refusal(name, value), name)
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
        logprobs=logprobs,
        structured=parse_structured(fields),
        logit_bias=parse_logit_bias(fields),
        allowed_token_ids=parse_allowed_token_ids(fields))


def _request(fields: _Fields, generations: tuple[GenerationRequest, ...], chat: bool,
             logprobs: bool) -> OpenAIRequest:
    stream = fields.get("stream", False, "boolean")
    options = fields.get("stream_options", None, "object")
    if options is not None and not stream:
        raise OpenAIParamError("stream_options is only allowed when stream is true",
                               "stream_options")
    options = options or {}
    for key in options:
        if key not in STREAM_OPTIONS:
            raise OpenAIParamError(f"stream_options.{key} is not supported: stream_options "
                                   f"takes {' and '.join(STREAM_OPTIONS)}",
                                   f"stream_options.{key}")
    include_usage, continuous = (
        options.get(key) is not None and expect(options[key], f"stream_options.{key}",
                                                "boolean") for key in STREAM_OPTIONS)
    return OpenAIRequest(generations, stream=stream, include_usage=include_usage, chat=chat,
                         logprobs=logprobs, continuous_usage=include_usage and continuous)


# What stream_options may hold: OpenAI's include_usage and vLLM's continuous_usage_stats.
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")
