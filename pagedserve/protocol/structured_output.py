"""A request's constraint on the form of its output, as the gateway hands it to an executor.

The APIs spell it many ways (OpenAI's `response_format`, vLLM's `structured_outputs` and the
older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`; a tool call that
`tool_choice` requires): the gateway turns each into one of these, and the executor compiles it
with its grammar engine into a token mask applied before every sampled token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# json_schema: `spec` is a JSON Schema as JSON text; json_object: any JSON object (`spec`
# empty); regex: `spec` is the pattern the whole output matches; choice: `spec` is a JSON list
# of the strings the output may be, exactly one of them; grammar: `spec` is an EBNF grammar.
StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
STRUCTURED_KINDS: tuple[StructuredKind, ...] = ("json_schema", "json_object", "regex",
                                                "choice", "grammar")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    kind: StructuredKind
    spec: str = ""
