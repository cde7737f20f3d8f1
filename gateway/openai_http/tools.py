"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, checked, as what the
gateway does with them: the definitions the chat template lists, how the answer is read
(gateway/tool_calls.py ToolUse), and for `required` or a named function the JSON Schema the
grammar engine holds the output to, built as vLLM builds it:

    named function   the function's `parameters` (an empty object schema if it has none):
                     the output is the call's arguments
    required         an array of 1 or more (at most 1 without parallel calls) objects
                     {"name": <one tool's name>, "parameters": <that tool's schema>} and no
                     other key, anyOf per tool; `$defs` of the tools' schemas gathered at the
                     top

Defaults as OpenAI's: tool_choice "auto" when tools are given, "none" otherwise. `tools: []`
counts as no tools. With tool_choice "none" the tools are still listed in the prompt (vLLM's
default), and the answer is plain text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.openai_http.json_values import OpenAIParamError, expect
from gateway.tool_calls import ToolCall, ToolUse
from pagedserve.protocol.structured_output import StructuredOutput

TOOL_KEYS = frozenset({"type", "function"})
FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
EMPTY_OBJECT_SCHEMA = {"type": "object", "properties": {}}
MODES = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class RequestTools:
    # What the chat template gets as `tools`: {"type": "function", "function": {...}} each;
    # None when the request has none.
    definitions: tuple[dict[str, Any], ...] | None
    use: ToolUse
    # required / a named function: what the output must be.
    constraint: StructuredOutput | None


NO_TOOLS = RequestTools(None, ToolUse("none"), None)


def parse_tools(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> RequestTools:
    """The three fields as the body holds them (None: not given)."""
    definitions = _definitions(tools) if tools is not None else ()
    parallel = True if parallel_tool_calls is None else expect(
        parallel_tool_calls, "parallel_tool_calls", "boolean")
    use = _tool_use(tool_choice, definitions, parallel)
    by_name = {d["function"]["name"]: d["function"] for d in definitions}
    if use.mode == "function":
        constraint = _schema(by_name[use.function].get("parameters") or EMPTY_OBJECT_SCHEMA)
    elif use.mode == "required":
        constraint = _schema(_calls_schema(list(by_name.values()), parallel))
    else:
        constraint = None
    return RequestTools(definitions or None, use, constraint)


def _definitions(tools: Any) -> tuple[dict[str, Any], ...]:
    expect(tools, "tools", "array")
    seen: set[str] = set()
    definitions = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        expect(tool, where, "object")
        _refuse_unknown_keys(tool, TOOL_KEYS, where)
        function, name = _function_of(tool, where, FUNCTION_KEYS)
        if name in seen:
            raise OpenAIParamError(f"{where}.function.name: {name!r} is defined twice",
                                   f"{where}.function.name")
        seen.add(name)
        checked = {"name": name}
        for key, kind in (("description", "string"), ("parameters", "object"),
                          ("strict", "boolean")):
            if function.get(key) is not None:
                checked[key] = expect(function[key], f"{where}.function.{key}", kind)
        schema_type = checked.get("parameters", {}).get("type", "object")
        if schema_type != "object":
            raise OpenAIParamError(f"{where}.function.parameters must be an object schema "
                                   f'(type "object"), got type {schema_type!r}',
                                   f"{where}.function.parameters")
        definitions.append({"type": "function", "function": checked})
    return tuple(definitions)


def _function_of(item: dict[str, Any], where: str, known: frozenset[str] | None = None
                 ) -> tuple[dict[str, Any], str]:
    """A tool's or a tool call's `function` object and its name, checked: the item's type is
    "function" and the name a non-empty string; with `known`, no other key."""
    if item.get("type", "function") != "function":
        raise OpenAIParamError(f'{where}.type must be "function", got {item["type"]!r}',
                               f"{where}.type")
    if item.get("function") is None:
        raise OpenAIParamError(f"{where}.function is required", f"{where}.function")
    function = expect(item["function"], f"{where}.function", "object")
    if known is not None:
        _refuse_unknown_keys(function, known, f"{where}.function")
    name = function.get("name")
    if not name or not isinstance(name, str):
        raise OpenAIParamError(f"{where}.function.name is required: a non-empty string",
                               f"{where}.function.name")
    return function, name


def _refuse_unknown_keys(value: dict[str, Any], known: frozenset[str], where: str) -> None:
    for key in value:
        if key not in known and value[key] is not None:
            raise OpenAIParamError(f"{where}.{key} is not a field of a function tool; known: "
                                   f"{', '.join(sorted(known))}", f"{where}.{key}")


def _tool_use(tool_choice: Any, definitions: tuple[dict[str, Any], ...], parallel: bool
              ) -> ToolUse:
    if tool_choice is None:
        return ToolUse("auto" if definitions else "none", parallel=parallel)
    expect(tool_choice, "tool_choice", "string", "object")
    if tool_choice == "none":
        return ToolUse("none", parallel=parallel)
    if isinstance(tool_choice, str):
        if tool_choice not in MODES:
            raise OpenAIParamError(f'tool_choice must be "none", "auto", "required" or '
                                   f'{{"type": "function", "function": {{"name": ...}}}}, got '
                                   f"{tool_choice!r}", "tool_choice")
        use = ToolUse(tool_choice, parallel=parallel)
    else:
        use = ToolUse("function", _named_function(tool_choice), parallel)
    if not definitions:
        raise OpenAIParamError(f"tool_choice {json.dumps(tool_choice)} needs tools: give at "
                               "least one in tools", "tool_choice")
    names = [d["function"]["name"] for d in definitions]
    if use.mode == "function" and use.function not in names:
        raise OpenAIParamError(f"tool_choice names function {use.function!r}, which is not "
                               f"among tools ({', '.join(names)})", "tool_choice")
    return use


def _named_function(tool_choice: dict[str, Any]) -> str:
    if tool_choice.get("type", "function") != "function":
        raise OpenAIParamError(f'tool_choice.type must be "function", got '
                               f"{tool_choice['type']!r}", "tool_choice.type")
    function = tool_choice.get("function")
    if function is None:
        raise OpenAIParamError('tool_choice.function is required: {"name": ...}',
                               "tool_choice.function")
    expect(function, "tool_choice.function", "object")
    name = function.get("name")
    if not name or not isinstance(name, str):
        raise OpenAIParamError("tool_choice.function.name is required: a non-empty string",
                               "tool_choice.function.name")
    return name


def _calls_schema(functions: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """The array of calls `required` asks for. A tool schema's `$defs` move to the top, where
    its `#/$defs/...` references point once it is nested in the array."""
    shared_defs: dict[str, Any] = {}
    alternatives = []
    for function in functions:
        parameters = dict(function.get("parameters") or EMPTY_OBJECT_SCHEMA)
        defs = parameters.pop("$defs", None) or {}
        if not isinstance(defs, dict):
            raise OpenAIParamError(f"$defs of function {function['name']!r}'s parameters "
                                   "must be an object", "tools")
        for name, schema in defs.items():
            if shared_defs.setdefault(name, schema) != schema:
                raise OpenAIParamError(f"$defs entry {name!r} differs between tools; "
                                       "tool_choice \"required\" needs one meaning per name",
                                       "tools")
        # Unlike vLLM's, no keys beside the two: a free extra key lets a weak model write
        # on until max_tokens.
        alternatives.append({"properties": {"name": {"type": "string",
                                                     "enum": [function["name"]]},
                                            "parameters": parameters},
                             "required": ["name", "parameters"],
                             "additionalProperties": False})
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": alternatives}}
    if not parallel:
        schema["maxItems"] = 1
    if shared_defs:
        schema["$defs"] = shared_defs
    return schema


def _schema(schema: dict[str, Any]) -> StructuredOutput:
    return StructuredOutput("json_schema", spec=json.dumps(schema, ensure_ascii=False))


def history_tool_calls(calls: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls` from the conversation so far. `arguments` is JSON
    text as OpenAI sends it; an object is taken too, as vLLM takes it."""
    expect(calls, where, "array")
    checked = []
    for index, call in enumerate(calls):
        here = f"{where}[{index}]"
        expect(call, here, "object")
        function, name = _function_of(call, here)
        arguments = function.get("arguments")
        arguments = "{}" if arguments is None else expect(
            arguments, f"{here}.function.arguments", "string", "object")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = "" if call.get("id") is None else expect(call["id"], f"{here}.id", "string")
        checked.append(ToolCall(call_id, name, arguments))
    return tuple(checked)
