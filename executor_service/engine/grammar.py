"""Structured output's grammars: a request's StructuredOutput compiled once, a matcher per
sequence that follows the tokens it accepts.

The grammar engine is llguidance (docs/structured-output.md says why: bench/grammar/ measures
it against xgrammar and outlines-core). It reads the checkpoint's tokenizer.json itself, so the
executor needs no `transformers`; byte-level and sentencepiece byte-fallback vocabularies both
work.

Compiling is `grammar_from` (schema, regex, choice or grammar text to llguidance's grammar)
and building a matcher over the tokenizer (lexer and parser tables). Both happen when a request
is added, so a bad schema is refused before anything runs; the result is kept in an LRU cache
keyed by (kind, spec), and every sequence gets a deep copy of the cached matcher, which costs
microseconds.

A matcher's state is the tokens it accepted. Each sequence holds its own: an n > 1 child or a
best_of sample copies its parent's before either accepts its first token (they were drawn from
the same logits under the same mask); a preempted sequence keeps its tokens, so its matcher
stays right for the recompute.

An object schema that does not say whether it allows properties it does not list is closed
(`additionalProperties: false`), as in vLLM's default engine (xgrammar's strict mode): a
client's schema names what it wants back, and with other keys open a weak or random model
invents a key and writes it until max_tokens (langchain's tools hit exactly this).

JSON is generated compact, with Python's separators (", " and ": ") and no other whitespace:
vLLM's `disable_any_whitespace`. With whitespace free, a weak or random model can emit
whitespace until max_tokens and never close the object; one spelling per value ends it.
"""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence

import llguidance

from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.structured_output import StructuredOutput

# Compiled grammars kept; a tool-calling client sends the same few schemas again and again.
GRAMMAR_CACHE_SIZE = 256
# An engine error message can quote the whole grammar; the client needs the start of it.
MAX_ERROR_CHARS = 600
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT = '{"type": "object"}'

log = logging.getLogger(__name__)


def grammar_text(structured: StructuredOutput) -> str:
    """llguidance's grammar for a constraint; raises InvalidArgument naming the kind when the
    spec cannot even be read (the matcher catches the rest)."""
    kind, spec = structured.kind, structured.spec
    try:
        if kind in ("json_schema", "json_object"):
            schema = json.loads(spec if kind == "json_schema" else ANY_JSON_OBJECT)
            if not isinstance(schema, dict):
                raise ValueError("the schema must be a JSON object")
            if kind == "json_schema":
                schema = closed_objects(schema)
            return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                                 defaults=JSON_OPTIONS)
        if kind == "choice":
            choices = json.loads(spec)
            if (not isinstance(choices, list) or not choices
                    or not all(isinstance(c, str) for c in choices)):
                raise ValueError("the choices must be a non-empty list of strings")
            return llguidance.grammar_from("choice", spec)
        if kind == "regex":
            return llguidance.grammar_from("regex", spec)
        if kind == "grammar":
            # GBNF / EBNF (what vLLM's default engine reads) or Lark: llguidance tells them
            # apart and converts GBNF to Lark.
            return llguidance.grammar_from("grammar", spec)
    except ValueError as error:
        raise _invalid(structured, str(error)) from None
    raise InvalidArgument(f"structured output kind {kind!r} is not one this executor knows")


def closed_objects(schema):
    """`schema` with `additionalProperties: false` on every object schema that lists its
    properties and leaves that unsaid."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: closed_objects(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


class UnreadableTokenizer(ValueError):
    """llguidance cannot build its token tables from this tokenizer.json (a WordLevel
    vocabulary with no decoder, say). The executor then serves free text and refuses
    structured output with this message, rather than not starting at all."""


class GrammarCompiler:
    """Compiles constraints for one tokenizer, keeping the most recent GRAMMAR_CACHE_SIZE."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int],
                 cache_size: int = GRAMMAR_CACHE_SIZE) -> None:
        """`vocab_size` is the model's (the logits' width), which may exceed the tokenizer's;
        the ids past the tokenizer's are never allowed. End-of-sequence tokens are allowed
        exactly where the grammar may end. Raises UnreadableTokenizer when llguidance cannot
        read the tokenizer."""
        self.vocab_size = vocab_size
        try:
            self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                    eos_token=sorted(eos_token_ids))
        except ValueError as error:
            raise UnreadableTokenizer(
                f"structured output is off for this model: llguidance cannot read its "
                f"tokenizer.json ({error})") from None
        self.cache_size = cache_size
        self._cache: OrderedDict[StructuredOutput, llguidance.LLMatcher] = OrderedDict()
        # add_request may run on a session thread while the engine loop compiles another.
        self._lock = threading.Lock()
        self.num_compiled = 0

    def matcher(self, structured: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher for a sequence; raises InvalidArgument naming the kind when the
        constraint does not compile."""
        with self._lock:
            template = self._cache.get(structured)
            if template is not None:
                self._cache.move_to_end(structured)
                return template.deep_copy()
        template = self._compile(structured)
        with self._lock:
            self._cache[structured] = template
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return template.deep_copy()

    def _compile(self, structured: StructuredOutput) -> llguidance.LLMatcher:
        grammar = grammar_text(structured)
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise _invalid(structured, matcher.get_error())
        self.num_compiled += 1
        return matcher


def accept_token(matcher: llguidance.LLMatcher, token: int) -> bool:
    """Advances the matcher by a sampled token; returns whether the grammar is now complete.
    Then only EOS may follow: the next mask forces it, and the sequence ends on it with reason
    "stop", as every stop does (one more decode step, as in vLLM, but one meaning for "stop":
    the last token is a stop token, which the gateway leaves out of the text).

    The token was drawn under the matcher's mask, so it is always accepted; a refusal is an
    engine bug, logged, and the sequence is ended rather than left to run unconstrained (one
    request's bug must not fail the iteration of every other).
    """
    if not matcher.consume_token(token):
        log.error("the grammar refused token %d that its own mask allowed: %s", token,
                  matcher.get_error())
        return True
    return matcher.is_stopped()


def _invalid(structured: StructuredOutput, error: str) -> InvalidArgument:
    error = " ".join(error.split())
    if len(error) > MAX_ERROR_CHARS:
        error = error[:MAX_ERROR_CHARS] + " ..."
    return InvalidArgument(f"structured output: the {structured.kind} is invalid: {error}")
