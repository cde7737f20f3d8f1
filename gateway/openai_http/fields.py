"""Every request field OpenAI's API or vLLM's server defines for /v1/completions and
/v1/chat/completions, and what this gateway does with each: supported, refused, or ignored.

A field is refused when it would change what is generated or returned and is not implemented:
it gets a 400 naming it, never a silent 200 that looks like success. A refused field is accepted
only at a value that asks for nothing (`min_tokens: 0`, `echo: false`, `functions: []`), since
clients send those by default. Ignored fields are the few that change nothing here (`user`,
`metadata`, ...). A key in neither OpenAI's nor vLLM's schema is refused as OpenAI refuses it
("Unrecognized request argument supplied"), so a typo (`max_token`) does not pass unnoticed.
null reads as not given, for every field.

The field list is vLLM 0.32's request models (`CompletionRequest`, `ChatCompletionRequest`)
plus OpenAI's fields vLLM lacks and the guided-decoding fields vLLM used to take. The table in
docs/api-http.md is rendered from here (`make docs`), and tests/gateway/test_field_table.py
sends every row's example to a running gateway.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

COMPLETIONS, CHAT = "completions", "chat"
BOTH = (COMPLETIONS, CHAT)


class Handling(Enum):
    SUPPORTED = "supported"
    REFUSED = "refused"
    IGNORED = "ignored"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    endpoints: tuple[str, ...]
    handling: Handling
    # Refused: why, the end of the 400's message. Ignored: why ignoring changes nothing.
    why: str = ""
    # Refused: values that ask for nothing, accepted.
    neutral: tuple[Any, ...] = ()
    # What the field-table test sends: the field with a value that must be refused (refused),
    # must work (supported) or must be accepted (ignored), with any companion fields it needs.
    # None: the field is part of every request's base body (model, prompt, messages).
    example: dict[str, Any] | None = None

    def refusal(self) -> str:
        return f"{self.name} is not supported: {self.why}"


def _supported(name: str, endpoints: tuple[str, ...], example: dict | None) -> Field:
    return Field(name, endpoints, Handling.SUPPORTED, example=example)


def _refused(name: str, endpoints: tuple[str, ...], why: str, example: Any,
             neutral: tuple[Any, ...] = ()) -> Field:
    return Field(name, endpoints, Handling.REFUSED, why, neutral, {name: example})


def _ignored(name: str, endpoints: tuple[str, ...], why: str, example: Any) -> Field:
    return Field(name, endpoints, Handling.IGNORED, why, example={name: example})


_OLD_FUNCTIONS = "OpenAI's deprecated functions API; use "
# The field table's example tool.
_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
_ONE_GRAMMAR_ENGINE = ("structured output has one grammar engine, llguidance "
                       "(docs/structured-output.md)")
_NO_VLLM_INTERNALS = "a vLLM-internal option with no counterpart here"
_NO_MULTIMODAL = "text models only"

FIELDS: tuple[Field, ...] = (
    # -- what every request has ----------------------------------------------------------------
    _supported("model", BOTH, None),
    _supported("prompt", (COMPLETIONS,), None),
    _supported("messages", (CHAT,), None),
    # -- supported -----------------------------------------------------------------------------
    _supported("max_tokens", BOTH, {"max_tokens": 2}),
    _supported("max_completion_tokens", (CHAT,), {"max_completion_tokens": 2}),
    _supported("n", BOTH, {"n": 2}),
    _supported("temperature", BOTH, {"temperature": 0.5}),
    _supported("top_p", BOTH, {"top_p": 0.9}),
    _supported("top_k", BOTH, {"top_k": 5}),
    _supported("min_p", BOTH, {"min_p": 0.05}),
    _supported("presence_penalty", BOTH, {"presence_penalty": 0.5}),
    _supported("frequency_penalty", BOTH, {"frequency_penalty": 0.5}),
    _supported("repetition_penalty", BOTH, {"repetition_penalty": 1.1}),
    _supported("seed", BOTH, {"seed": 7}),
    _supported("stop", BOTH, {"stop": ["\n\n"]}),
    _supported("stop_token_ids", BOTH, {"stop_token_ids": [3]}),
    _supported("ignore_eos", BOTH, {"ignore_eos": True}),
    _supported("logprobs", (COMPLETIONS,), {"logprobs": 2}),
    _supported("logprobs", (CHAT,), {"logprobs": True}),
    _supported("top_logprobs", (CHAT,), {"logprobs": True, "top_logprobs": 2}),
    _supported("stream", BOTH, {"stream": True}),
    _supported("stream_options", BOTH, {"stream": True, "stream_options": {
        "include_usage": True}}),
    _supported("use_beam_search", BOTH, {"use_beam_search": True, "n": 2, "temperature": 0}),
    _supported("length_penalty", BOTH, {"use_beam_search": True, "n": 2, "temperature": 0,
                                        "length_penalty": 0.5}),
    _supported("early_stopping", BOTH, {"use_beam_search": True, "n": 2, "temperature": 0,
                                        "early_stopping": True}),
    _supported("best_of", BOTH, {"best_of": 2, "n": 1}),
    _supported("skip_special_tokens", BOTH, {"skip_special_tokens": False}),
    _supported("cache_salt", BOTH, {"cache_salt": "tenant-a"}),
    _supported("add_generation_prompt", (CHAT,), {"add_generation_prompt": False}),
    _supported("tools", (CHAT,), {"tools": [_TOOL]}),
    _supported("tool_choice", (CHAT,), {"tools": [_TOOL], "tool_choice": "auto"}),
    _supported("parallel_tool_calls", (CHAT,), {"tools": [_TOOL], "parallel_tool_calls": False}),
    _supported("echo", (COMPLETIONS,), {"echo": True}),
    _supported("prompt_logprobs", BOTH, {"prompt_logprobs": 1}),
    _supported("logit_bias", BOTH, {"logit_bias": {"65": 5}}),
    _supported("allowed_token_ids", BOTH, {"allowed_token_ids": [65, 66]}),
    _supported("response_format", BOTH, {"response_format": {"type": "json_object"}}),
    _supported("structured_outputs", BOTH, {"structured_outputs": {"choice": ["a", "b"]}}),
    _supported("guided_json", BOTH, {"guided_json": {"type": "object", "properties": {
        "a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}}),
    _supported("guided_regex", BOTH, {"guided_regex": "[ab]"}),
    _supported("guided_choice", BOTH, {"guided_choice": ["a", "b"]}),
    _supported("guided_grammar", BOTH, {"guided_grammar": 'root ::= "a" | "b"'}),
    # -- refused unless neutral ----------------------------------------------------------------
    _refused("echo", (CHAT,), "the response holds only the completion, not the prompt",
             True, (False,)),
    _refused("suffix", (COMPLETIONS,), "there is no fill-in-the-middle", "end", ("",)),
    _refused("logprob_token_ids", BOTH, "log-probabilities of chosen token ids are not "
             "computed", [3]),
    _refused("min_tokens", BOTH, "there is no minimum length; stop tokens and end-of-sequence "
             "end a completion at any length", 4, (0,)),
    _refused("include_stop_str_in_output", BOTH, "a matched stop string is never returned",
             True, (False,)),
    _refused("bad_words", BOTH, "words cannot be banned", ["x"], ([],)),
    _refused("truncate_prompt_tokens", BOTH, "prompts are never truncated; one too long for "
             "the context window gets a 400", 8),
    _refused("truncation_side", BOTH, "prompts are never truncated", "left"),
    _refused("spaces_between_special_tokens", BOTH, "special tokens are always decoded with "
             "the tokenizer's own spacing", False, (True,)),
    _refused("add_special_tokens", (COMPLETIONS,), "a completion prompt always gets the "
             "tokenizer's special tokens", False, (True,)),
    _refused("add_special_tokens", (CHAT,), "the chat template alone decides the special "
             "tokens", True, (False,)),
    _refused("continue_final_message", (CHAT,), "the last message cannot be continued; use "
             "add_generation_prompt", True, (False,)),
    _refused("chat_template", (CHAT,), "the checkpoint's chat template is always used",
             "{{ messages }}"),
    _refused("chat_template_kwargs", (CHAT,), "the chat template gets no extra variables",
             {"enable_thinking": False}, ({},)),
    _refused("documents", (CHAT,), "the chat template gets no documents", [{"text": "d"}],
             ([],)),
    _refused("guided_decoding_backend", BOTH, _ONE_GRAMMAR_ENGINE, "xgrammar"),
    _refused("guided_whitespace_pattern", BOTH, "JSON is generated compact, with no other "
             "whitespace (docs/structured-output.md)", " "),
    _refused("functions", (CHAT,), _OLD_FUNCTIONS + "tools", [{"name": "f"}], ([],)),
    _refused("function_call", (CHAT,), _OLD_FUNCTIONS + 'tool_choice; only "none" is '
             "accepted", "auto", ("none",)),
    _refused("reasoning_effort", (CHAT,), "no reasoning budget is implemented", "low"),
    _refused("thinking_token_budget", BOTH, "no reasoning budget is implemented", 64),
    _refused("priority", BOTH, "requests are scheduled first come, first served", 1, (0,)),
    _refused("request_id", BOTH, "the gateway assigns request ids (the x-request-id header)",
             "mine"),
    _refused("return_tokens_as_token_ids", BOTH, "tokens are returned as text", True,
             (False,)),
    _refused("return_token_ids", BOTH, "responses do not carry token ids", True, (False,)),
    _refused("return_token_offsets", BOTH, "responses do not carry token offsets", True,
             (False,)),
    _refused("return_prompt_text", (CHAT,), "responses do not carry the prompt", True,
             (False,)),
    _refused("stream_interval", BOTH, "every token is streamed as it comes", 4, (1,)),
    _refused("watermarking", BOTH, "there is no watermarking", {"enabled": True}),
    _refused("repetition_detection", BOTH, "there is no repetition detection", {"n": 4}),
    _refused("prompt_embeds", (COMPLETIONS,), "prompts are text or token ids", "AAAA"),
    _refused("mm_payload", BOTH, _NO_MULTIMODAL, {"image": "x"}),
    _refused("return_mm_kwargs", BOTH, _NO_MULTIMODAL, True, (False,)),
    _refused("media_io_kwargs", (CHAT,), _NO_MULTIMODAL, {"image": {}}, ({},)),
    _refused("mm_processor_kwargs", (CHAT,), _NO_MULTIMODAL, {"x": 1}, ({},)),
    _refused("modalities", (CHAT,), _NO_MULTIMODAL + '; only ["text"] is accepted',
             ["text", "audio"], (["text"],)),
    _refused("audio", (CHAT,), _NO_MULTIMODAL, {"voice": "alloy", "format": "wav"}),
    _refused("prediction", (CHAT,), "there is no predicted-output decoding",
             {"type": "content", "content": "x"}),
    _refused("web_search_options", (CHAT,), "there is no web search", {}),
    _refused("routed_experts_prompt_start", BOTH, _NO_VLLM_INTERNALS, 0),
    _refused("kv_transfer_params", BOTH, _NO_VLLM_INTERNALS, {"x": 1}),
    _refused("ec_transfer_params", BOTH, _NO_VLLM_INTERNALS, {"x": 1}),
    _refused("vllm_xargs", BOTH, _NO_VLLM_INTERNALS, {"x": 1}),
    # -- ignored -------------------------------------------------------------------------------
    _ignored("user", BOTH, "an end-user id for the caller's own abuse tracking", "u-1"),
    _ignored("safety_identifier", (CHAT,), "an end-user id for the caller's own abuse tracking",
             "u-1"),
    _ignored("metadata", BOTH, "tags for OpenAI's stored completions; nothing is stored",
             {"k": "v"}),
    _ignored("store", (CHAT,), "OpenAI's stored completions; nothing is stored", True),
    _ignored("service_tier", (CHAT,), "OpenAI's billing tiers", "auto"),
    _ignored("session_id", BOTH, "vLLM's session tag for its own routing", "s-1"),
    _ignored("prompt_cache_key", (CHAT,), "OpenAI's cache-routing hint; the prefix cache finds "
             "shared prompts by their blocks", "k"),
    _ignored("include_reasoning", (CHAT,), "no reasoning parser: every token is content", True),
    _ignored("verbosity", (CHAT,), "OpenAI's hint to its own models; max_tokens bounds the "
             "length", "low"),
)

_BY_ENDPOINT: dict[str, dict[str, Field]] = {
    endpoint: {f.name: f for f in FIELDS if endpoint in f.endpoints} for endpoint in BOTH}


def unrecognized(name: str) -> tuple[str, str]:
    """(message, field) for a key no API defines, in OpenAI's words."""
    return f"Unrecognized request argument supplied: {name}", name


def refused_field(body: dict[str, Any], endpoint: str) -> tuple[str, str] | None:
    """(message, field) for the first key of `body` this endpoint refuses; None when every key
    is supported, ignored, null, or refused at a neutral value."""
    return refused_key(body, _BY_ENDPOINT[endpoint])


def refused_key(body: dict[str, Any], known: dict[str, Field]) -> tuple[str, str] | None:
    """refused_field against `known`, an endpoint's fields by name: /v1/responses keeps its
    own (gateway/openai_http/responses_api.py)."""
    for name, value in body.items():
        if value is None:
            continue
        entry = known.get(name)
        if entry is None:
            return unrecognized(name)
        if entry.handling is Handling.REFUSED and not _is_neutral(value, entry.neutral):
            return entry.refusal(), name
    return None


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # Same JSON type too: `0 == False` and `1 == True` to Python, not to JSON.
    return any(type(value) is type(n) and value == n for n in neutral)
