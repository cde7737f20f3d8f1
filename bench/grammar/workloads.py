"""What the grammar engines are measured on: a byte-level BPE tokenizer trained here (nothing
is downloaded) and the constraints, each with one token sequence it accepts that every engine
replays, so each one masks exactly the same steps."""
from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|eos|>"
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get_weather", "search", "book_flight"]},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "units": {"enum": ["metric", "imperial"]},
            "stops": {"type": "array", "items": {"type": "string", "maxLength": 8},
                      "maxItems": 4},
            "return": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 10}]}},
            "required": ["city", "days", "units", "return"], "additionalProperties": False},
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999999},
        "title": {"type": "string", "maxLength": 40},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}},
        "published": {"type": "boolean"},
    },
    "required": ["id", "title", "score", "tags", "published"],
    "additionalProperties": False,
}
EMAIL = r"[a-z]{3,12}\.[a-z]{3,12}@[a-z]{4,10}\.(com|org|net)"
SQL = ('root ::= "SELECT " cols " FROM " name (" WHERE " name " = " num)?\n'
       'cols ::= name (", " name)*\nname ::= [a-z]{1,8}\nnum ::= [0-9]{1,4}')


@dataclass(frozen=True, slots=True)
class Constraint:
    name: str
    kind: str        # json_schema, regex or grammar
    spec: str


CONSTRAINTS = (Constraint("tool call (json_schema)", "json_schema", json.dumps(TOOL_CALL)),
               Constraint("record (json_schema)", "json_schema", json.dumps(RECORD)),
               Constraint("email (regex)", "regex", EMAIL),
               Constraint("SQL (EBNF grammar)", "grammar", SQL))


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """A GPT-2-style byte-level BPE trained on Python's own standard library sources: code and
    English, like the JSON a model writes, with real merges across punctuation."""
    stdlib = Path(json.__file__).parent.parent
    files = sorted(str(p) for p in stdlib.glob("*.py"))[:400 if vocab_size > 4096 else 40]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train(files, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Each id's bytes (byte-level symbols mapped back to bytes); special tokens: b""."""
    decode = _byte_level_decoder()
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    result = [b""] * tokenizer.get_vocab_size(with_added_tokens=True)
    for token, token_id in vocab.items():
        if token != EOS:
            result[token_id] = bytes(decode[c] for c in token)
    return result


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable bytes stand for themselves, the others
    for the characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


def sample_tokens(tokenizer_json: str, eos_id: int, vocab_size: int, constraint: Constraint,
                  seed: int, max_tokens: int = 200) -> list[int]:
    """One token sequence the constraint accepts, drawn with llguidance under random logits
    (ending at EOS, excluded); every engine then replays it."""
    import llguidance
    import llguidance.torch
    import torch

    from executor_service.engine.grammar import GrammarCompiler
    from pagedserve.protocol.structured_output import StructuredOutput

    matcher = GrammarCompiler(tokenizer_json, vocab_size, [eos_id]).matcher(
        StructuredOutput(constraint.kind, constraint.spec))
    generator = torch.Generator().manual_seed(seed)
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    tokens: list[int] = []
    rng = random.Random(seed)
    for _ in range(max_tokens):
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask)
        logits = torch.randn(1, vocab_size, generator=generator)
        # Favour the end a little, so texts finish within max_tokens.
        logits[0, eos_id] += 2.0 + rng.random()
        llguidance.torch.apply_token_bitmask_inplace(logits, bitmask)
        token = int(logits.argmax())
        if token == eos_id:
            return tokens
        matcher.consume_token(token)
        tokens.append(token)
    print(f"warning: {constraint.name} sample did not end in {max_tokens} tokens",
          file=sys.stderr)
    return tokens
