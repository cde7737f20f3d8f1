"""Typed reads of the JSON values in an OpenAI request body, and the error that names the field
a value was refused for. Shared by the request parsers of the generation endpoints, the tool
definitions and the tokenizer endpoints."""
from __future__ import annotations

from typing import Any

from pagedserve.common.errors import InvalidArgument


class OpenAIParamError(InvalidArgument):
    """A request OpenAI's API would refuse, or that this gateway does not support. `param` names
    the JSON field as OpenAI's error body does ("temperature", "messages[2].content"); None for
    the body as a whole."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def json_object(body: object) -> dict[str, Any]:
    """`body` if it is a JSON object; every endpoint's body must be one."""
    if not isinstance(body, dict):
        raise OpenAIParamError(
            f"the request body must be a JSON object, got {a_json(json_type(body))}")
    return body


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):      # before int: bool is an int to Python, not to JSON
        return "boolean"
    for kind, python in (("integer", int), ("number", float), ("string", str),
                         ("array", list), ("object", dict)):
        if isinstance(value, python):
            return kind
    return type(value).__name__


def a_json(kind: str) -> str:
    """The JSON type's name with its article, for messages: "an integer", "a string"."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def expect(value: Any, param: str, *kinds: str) -> Any:
    """`value` if its JSON type is one of `kinds` (an integer is a number too)."""
    kind = json_type(value)
    if kind in kinds or (kind == "integer" and "number" in kinds):
        return value
    raise OpenAIParamError(f"{param} must be {' or '.join(map(a_json, kinds))}, got {a_json(kind)}",
                           param)
