"""vLLM's tokenizer endpoints, as its server answers them, over the served model's tokenizer:

    POST /tokenize        {"prompt": text} or {"messages": [...], "tools": [...]} -> {"count",
                          "max_model_len", "tokens", "token_strs"}
    POST /detokenize      {"tokens": [...]} -> {"prompt": text}
    GET  /tokenizer_info  the special tokens, the chat template and the limits

Clients tokenize through these instead of downloading the tokenizer: lm-evaluation-harness's
`tokenizer_backend=remote` reads /tokenizer_info, then /tokenize and /detokenize. Pure
translation: the body and the ServedModel in, the response dict out. A body field named in
neither vLLM's request nor here is refused, as on the generation endpoints.
"""
from __future__ import annotations

from typing import Any

from gateway.executors.directory import ServedModel
from gateway.openai_http.fields import unrecognized
from gateway.openai_http.requests import OpenAIParamError, expect, parse_messages
from gateway.openai_http.tools import parse_tools

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "add_special_tokens",
                             "add_generation_prompt", "return_token_strs", "tools"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def tokenize(body: dict[str, Any], model: ServedModel) -> dict[str, Any]:
    _refuse_unknown(body, TOKENIZE_FIELDS)
    tokenizer = model.tokenizer
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise OpenAIParamError("send exactly one of prompt (a string) and messages", "prompt")
    if prompt is not None:
        text = expect(prompt, "prompt", "string")
        # vLLM's default: a completion prompt gets the tokenizer's special tokens.
        special = expect(body.get("add_special_tokens", True), "add_special_tokens", "boolean")
        tokens = tokenizer.encode(text, add_special_tokens=special)
    else:
        chat = parse_messages(messages)
        generation_prompt = expect(body.get("add_generation_prompt", True),
                                   "add_generation_prompt", "boolean")
        special = expect(body.get("add_special_tokens", False), "add_special_tokens", "boolean")
        tools = parse_tools(body.get("tools"), None, None).definitions
        tokens = tokenizer.encode_chat([m.template_message() for m in chat], generation_prompt,
                                       add_special_tokens=special, tools=tools)
    strings = None
    if expect(body.get("return_token_strs", False), "return_token_strs", "boolean"):
        strings = [tokenizer.tokenizer.id_to_token(token) for token in tokens]
    return {"count": len(tokens), "max_model_len": model.max_model_len, "tokens": tokens,
            "token_strs": strings}


def detokenize(body: dict[str, Any], model: ServedModel) -> dict[str, Any]:
    _refuse_unknown(body, DETOKENIZE_FIELDS)
    tokens = expect(body.get("tokens"), "tokens", "array")
    for index, token in enumerate(tokens):
        expect(token, f"tokens[{index}]", "integer")
        if not 0 <= token < model.vocab_size:
            raise OpenAIParamError(f"tokens[{index}] = {token} is outside {model.name}'s "
                                   f"vocabulary [0, {model.vocab_size})", "tokens")
    # vLLM decodes with special tokens kept: what was tokenized comes back.
    return {"prompt": model.tokenizer.decode(tokens, skip_special_tokens=False)}


def tokenizer_info(model: ServedModel) -> dict[str, Any]:
    tokenizer = model.tokenizer
    return {"tokenizer_class": "PreTrainedTokenizerFast", **tokenizer.special_tokens,
            "chat_template": tokenizer.chat_template.source,
            "model_max_length": model.max_model_len, "vocab_size": model.vocab_size}


def _refuse_unknown(body: dict[str, Any], known: frozenset[str]) -> None:
    for name, value in body.items():
        if value is not None and name not in known:
            raise OpenAIParamError(*unrecognized(name))
