"""The request fields that constrain the output (structured output) or the vocabulary
(logit_bias, allowed_token_ids), read from a request body. Pure translation, like requests.py.

Structured output has many spellings; each becomes one StructuredOutput:

- OpenAI's `response_format`: {"type": "text"} (nothing), {"type": "json_object"},
  {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}. The
  schema is always enforced, `strict` or not.
- vLLM's `structured_outputs`: exactly one of "json" (a schema, an object or its JSON text),
  "regex", "choice", "grammar" (EBNF/GBNF or Lark), "json_object": true.
- vLLM's older `guided_json` (object or JSON text), `guided_regex`, `guided_choice`,
  `guided_grammar`.

A request may carry one constraint: two (say response_format and guided_regex) are refused
naming both, rather than one silently winning. Only their form is checked here; whether a
schema, regex or grammar compiles is the executor's to say (executor_service/engine/
grammar.py), which refuses it before generating anything.
"""
from __future__ import annotations

import json
from typing import Any, Protocol

from gateway.openai_http.json_values import OpenAIParamError, expect
from pagedserve.protocol.structured_output import StructuredOutput

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# structured_outputs' keys that choose the constraint, and the kind each becomes.
STRUCTURED_OUTPUTS_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice",
                            "grammar": "grammar", "json_object": "json_object"}
# structured_outputs' other keys that vLLM defines, at the value that matches what we do
# (JSON is always compact; there is one engine, so nothing to fall back to or pick).
STRUCTURED_OUTPUTS_NEUTRAL = {"disable_any_whitespace": (True,),
                              "disable_additional_properties": (False,),
                              "disable_fallback": (True, False),
                              "whitespace_pattern": (), "structural_tag": (),
                              "_backend": (), "backend": ()}


class Fields(Protocol):
    """What requests.py's typed field reader offers."""

    def get(self, name: str, default: Any, *kinds: str) -> Any: ...


def parse_structured(fields: Fields) -> StructuredOutput | None:
    """The request's one constraint on its output, or None."""
    found: dict[str, StructuredOutput] = {}
    response_format = fields.get("response_format", None, "object")
    if response_format is not None:
        structured = _response_format(response_format)
        if structured is not None:
            found["response_format"] = structured
    options = fields.get("structured_outputs", None, "object")
    if options is not None:
        found["structured_outputs"] = _structured_outputs(options)
    schema = fields.get("guided_json", None, "object", "string")
    if schema is not None:
        found["guided_json"] = StructuredOutput("json_schema", _schema(schema, "guided_json"))
    regex = fields.get("guided_regex", None, "string")
    if regex is not None:
        found["guided_regex"] = StructuredOutput("regex", regex)
    choice = fields.get("guided_choice", None, "array")
    if choice is not None:
        found["guided_choice"] = StructuredOutput("choice", _choices(choice, "guided_choice"))
    grammar = fields.get("guided_grammar", None, "string")
    if grammar is not None:
        found["guided_grammar"] = StructuredOutput("grammar", _grammar(grammar,
                                                                       "guided_grammar"))
    if len(found) > 1:
        names = list(found)
        raise OpenAIParamError(f"{', '.join(names[:-1])} and {names[-1]} each constrain the "
                               "output; send one of them", names[1])
    return next(iter(found.values()), None)


def _response_format(value: dict) -> StructuredOutput | None:
    kind = expect(value.get("type"), "response_format.type", "string")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        spec = expect(value.get("json_schema"), "response_format.json_schema", "object")
        expect(spec.get("name", ""), "response_format.json_schema.name", "string")
        if spec.get("strict") is not None:
            expect(spec["strict"], "response_format.json_schema.strict", "boolean")
        if spec.get("schema") is None:
            raise OpenAIParamError("response_format.json_schema.schema is required",
                                   "response_format.json_schema.schema")
        return StructuredOutput("json_schema", _schema(spec["schema"],
                                                       "response_format.json_schema.schema"))
    raise OpenAIParamError(f'response_format.type must be "text", "json_object" or '
                           f'"json_schema", got {kind!r}', "response_format.type")


def _structured_outputs(options: dict) -> StructuredOutput:
    chosen = [key for key in STRUCTURED_OUTPUTS_KINDS
              if options.get(key) is not None and options.get(key) is not False]
    for key, value in options.items():
        if key in STRUCTURED_OUTPUTS_KINDS or value is None:
            continue
        where = f"structured_outputs.{key}"
        if key not in STRUCTURED_OUTPUTS_NEUTRAL:
            raise OpenAIParamError(f"{where} is not a structured_outputs option", where)
        if value not in STRUCTURED_OUTPUTS_NEUTRAL[key]:
            raise OpenAIParamError(f"{where} = {json.dumps(value)} is not supported (JSON is "
                                   "generated compact, by this gateway's one grammar engine)",
                                   where)
    if len(chosen) != 1:
        raise OpenAIParamError("structured_outputs must set exactly one of "
                               f"{', '.join(STRUCTURED_OUTPUTS_KINDS)}; got "
                               f"{', '.join(chosen) or 'none'}", "structured_outputs")
    (key,) = chosen
    where, value = f"structured_outputs.{key}", options[key]
    kind = STRUCTURED_OUTPUTS_KINDS[key]
    if key == "json":
        return StructuredOutput(kind, _schema(expect(value, where, "object", "string"), where))
    if key == "json_object":
        expect(value, where, "boolean")
        return StructuredOutput(kind)
    if key == "choice":
        return StructuredOutput(kind, _choices(expect(value, where, "array"), where))
    if key == "grammar":
        return StructuredOutput(kind, _grammar(expect(value, where, "string"), where))
    return StructuredOutput(kind, expect(value, where, "string"))


def _schema(value: dict | str, where: str) -> str:
    """A JSON schema as JSON text; given as text, it must hold a JSON object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as error:
            raise OpenAIParamError(f"{where} is not valid JSON: {error}", where) from None
        if not isinstance(value, dict):
            raise OpenAIParamError(f"{where} must be a JSON schema (a JSON object)", where)
    return json.dumps(value)


def _choices(value: list, where: str) -> str:
    if not value:
        raise OpenAIParamError(f"{where} must hold at least one choice", where)
    for index, choice in enumerate(value):
        expect(choice, f"{where}[{index}]", "string")
    return json.dumps(value)


def _grammar(value: str, where: str) -> str:
    if not value.strip():
        raise OpenAIParamError(f"{where} must not be empty", where)
    return value


def parse_logit_bias(fields: Fields) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias}, the ids as JSON object keys (strings). Ranges
    (ids in the vocabulary, biases in [-100, 100]) are SamplingParams.validate's."""
    value = fields.get("logit_bias", None, "object") or {}
    pairs = []
    for key, bias in value.items():
        try:
            token_id = int(key)
        except ValueError:
            raise OpenAIParamError(f"logit_bias keys must be token ids (integers as strings), "
                                   f"got {key!r}", "logit_bias") from None
        pairs.append((token_id, float(expect(bias, f"logit_bias[{key!r}]", "number"))))
    return tuple(sorted(pairs))


def parse_allowed_token_ids(fields: Fields) -> tuple[int, ...]:
    """vLLM's allowed_token_ids: only these may be sampled; an empty list is refused (as vLLM
    does), since nothing could be generated."""
    value = fields.get("allowed_token_ids", None, "array")
    if value is None:
        return ()
    if not value:
        raise OpenAIParamError("allowed_token_ids must not be empty", "allowed_token_ids")
    return tuple(expect(token, f"allowed_token_ids[{index}]", "integer")
                 for index, token in enumerate(value))
