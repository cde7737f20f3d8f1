"""Every request field of OpenAI's Responses API (the `openai` package's ResponseCreateParams)
and of vLLM 0.32's ResponsesRequest, and what POST /v1/responses does with each: supported,
refused, or ignored, by fields.py's rules (a refused field is accepted at a value that asks for
nothing; a key in neither schema is refused as OpenAI refuses it).

The sampling fields and vLLM's extensions that the Responses request spells and means as the
chat request does are chat's own entries (fields.py): they are handed to the chat parser, so
they are supported, refused or ignored on both endpoints alike. The table in docs/api-http.md's
Responses section lists these entries, and tests/gateway/test_responses_api.py sends each
example to a running gateway.
"""
from __future__ import annotations

from typing import Any

from gateway.openai_http.fields import CHAT, FIELDS, Field, Handling

RESPONSES = "responses"
_NO_TOOLS = "this endpoint does not call tools"
_CACHE_POLICY = "OpenAI's cache policy; the prefix cache keeps blocks while memory allows"
_NOTHING_STORED = ("nothing is stored, so there is no earlier response to continue; send the "
                   "whole conversation as input")


def _supported(name: str) -> Field:
    return Field(name, (RESPONSES,), Handling.SUPPORTED)


def _refused(name: str, why: str, example: Any, neutral: tuple[Any, ...] = ()) -> Field:
    return Field(name, (RESPONSES,), Handling.REFUSED, why, neutral, {name: example})


def _ignored(name: str, why: str, example: Any) -> Field:
    return Field(name, (RESPONSES,), Handling.IGNORED, why, example={name: example})


# Fields /v1/responses shares with /v1/chat/completions, spelled and meaning the same on both:
# checked by chat's registry entry and handed to the chat parser as they are. Not the tool
# fields: the Responses API spells its tools differently.
SHARED_WITH_CHAT = (
    "model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
    "cache_salt", "logit_bias", "include_stop_str_in_output", "structured_outputs", "priority",
    "request_id", "watermarking", "chat_template_kwargs", "media_io_kwargs",
    "mm_processor_kwargs", "mm_payload", "return_mm_kwargs", "vllm_xargs", "kv_transfer_params",
    "ec_transfer_params", "user", "safety_identifier", "metadata", "service_tier", "session_id",
    "prompt_cache_key", "include_reasoning")
_CHAT_FIELDS = {entry.name: entry for entry in FIELDS if CHAT in entry.endpoints}

# Every field of OpenAI's ResponseCreateParams and vLLM 0.32's ResponsesRequest, by name.
RESPONSES_FIELDS: dict[str, Field] = {name: _CHAT_FIELDS[name] for name in SHARED_WITH_CHAT} | {
    entry.name: entry for entry in (
        _supported("input"),
        _supported("instructions"),
        _supported("max_output_tokens"),
        _supported("stream"),
        _refused("text", 'only plain text output ({"format": {"type": "text"}}) is implemented '
                 "here", {"format": {"type": "json_object"}}, ({}, {"format": {"type": "text"}})),
        _ignored("store", "nothing is stored, whatever it says (as vLLM by default); no "
                 "response can be retrieved later", True),
        _ignored("stream_options", "its one option pads deltas against side-channel attacks; "
                 "deltas go unpadded", {"include_obfuscation": True}),
        _ignored("prompt_cache_retention", _CACHE_POLICY, "24h"),
        _ignored("prompt_cache_options", _CACHE_POLICY, {"mode": "implicit", "ttl": "30m"}),
        _refused("tools", _NO_TOOLS, [{"type": "function", "name": "f", "parameters": {}}],
                 ([],)),
        _refused("tool_choice", _NO_TOOLS + '; only "none" and "auto" (with no tools, the '
                 'same) are accepted', "required", ("none", "auto")),
        _ignored("parallel_tool_calls", "tools are refused, so no call is ever made", True),
        _ignored("max_tool_calls", "tools are refused, so no call is ever made", 3),
        _refused("previous_response_id", _NOTHING_STORED, "resp_1"),
        _refused("conversation", _NOTHING_STORED, "conv_1"),
        _refused("previous_input_messages", _NOTHING_STORED,
                 [{"role": "user", "content": "Hi"}], ([],)),
        _refused("background", "every response is generated while the request waits", True,
                 (False,)),
        _refused("background_options", "every response is generated while the request waits",
                 {"mode": "x"}),
        _refused("include", "no extra output (log-probabilities, reasoning) can be included",
                 ["message.output_text.logprobs"], ([],)),
        _refused("top_logprobs", "log-probabilities are not returned here; "
                 "/v1/chat/completions returns them", 2, (0,)),
        _refused("reasoning", "no reasoning budget or summary is implemented",
                 {"effort": "low"}),
        _refused("truncation", "prompts are never truncated; one too long for the context "
                 "window gets a 400", "auto", ("disabled",)),
        _refused("context_management", "conversations are never compacted",
                 [{"type": "compaction"}], ([],)),
        _refused("prompt", "there are no stored prompt templates", {"id": "pmpt_1"}),
        _refused("moderation", "there is no moderation", {"input": {}}),
        _refused("image", "text models only", {"size": "1024x1024"}),
        _refused("access_programs", _NO_TOOLS, {"x": 1}),
        _refused("enable_response_messages", "responses do not carry the rendered messages",
                 True, (False,)),
    )}
