"""The contenders: each grammar engine behind the same three calls, built from the same
tokenizer. JSON is compact in all three (separators ", " and ": ", no other whitespace), as
the executor asks llguidance for it, so every engine accepts the replayed tokens."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from bench.grammar.workloads import Constraint

LLGUIDANCE, XGRAMMAR, OUTLINES = "llguidance", "xgrammar", "outlines-core"
CONTENDERS = (LLGUIDANCE, XGRAMMAR, OUTLINES)


class Engine(Protocol):
    name: str

    def supports(self, constraint: Constraint) -> bool: ...

    def compile(self, constraint: Constraint) -> Any:
        """Everything a request pays before its first mask, no cache."""

    def replay(self, compiled: Any, tokens: Sequence[int]) -> list[float]:
        """Seconds per mask: before each token and after the last (where EOS is allowed),
        each mask filled and the token accepted. Raises Refused when the engine's language
        differs and it refuses a token."""


class Refused(Exception):
    """The engine refused a token of the replayed sequence: its JSON or regex dialect differs
    from llguidance's (which drew the sequence) at that point."""


def installed(tokenizer_json: str, vocab: Sequence[bytes], eos_id: int) -> list[Engine]:
    """The contenders whose package imports here."""
    engines: list[Engine] = []
    for make in (Llguidance, Xgrammar, OutlinesCore):
        try:
            engines.append(make(tokenizer_json, vocab, eos_id))
        except ImportError as error:
            print(f"skipping {make.name}: {error}")
    return engines


class Llguidance:
    name = LLGUIDANCE

    def __init__(self, tokenizer_json: str, vocab: Sequence[bytes], eos_id: int) -> None:
        import llguidance
        import llguidance.torch

        from executor_service.engine.grammar import grammar_text
        self._llg, self._grammar_text = llguidance, grammar_text
        self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=len(vocab),
                                                 eos_token=eos_id)
        self._bitmask = llguidance.torch.allocate_token_bitmask(1, len(vocab))

    def supports(self, constraint: Constraint) -> bool:
        return True

    def compile(self, constraint: Constraint) -> Any:
        from pagedserve.protocol.structured_output import StructuredOutput
        grammar = self._grammar_text(StructuredOutput(constraint.kind, constraint.spec))
        matcher = self._llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def replay(self, matcher: Any, tokens: Sequence[int]) -> list[float]:
        fill, bitmask = self._llg.torch.fill_next_token_bitmask, self._bitmask
        return timed_replay(self.name, tokens, lambda: fill(matcher, bitmask),
                            matcher.consume_token)


class Xgrammar:
    name = XGRAMMAR

    def __init__(self, tokenizer_json: str, vocab: Sequence[bytes], eos_id: int) -> None:
        import xgrammar
        self._xgr = xgrammar
        # RAW: each entry is the token's bytes already (specials empty, EOS a stop token).
        info = xgrammar.TokenizerInfo(list(vocab), xgrammar.VocabType.RAW,
                                      vocab_size=len(vocab), stop_token_ids=[eos_id])
        self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self._bitmask = xgrammar.allocate_token_bitmask(1, len(vocab))

    def supports(self, constraint: Constraint) -> bool:
        return True

    def compile(self, constraint: Constraint) -> Any:
        if constraint.kind == "json_schema":
            compiled = self._compiler.compile_json_schema(
                constraint.spec, any_whitespace=False, separators=(", ", ": "))
        elif constraint.kind == "regex":
            compiled = self._compiler.compile_regex(constraint.spec)
        else:
            compiled = self._compiler.compile_grammar(constraint.spec)
        return self._xgr.GrammarMatcher(compiled)

    def replay(self, matcher: Any, tokens: Sequence[int]) -> list[float]:
        bitmask = self._bitmask
        return timed_replay(self.name, tokens, lambda: matcher.fill_next_token_bitmask(bitmask),
                            matcher.accept_token)


class OutlinesCore:
    """Regular languages only: a JSON schema becomes a regex first; no EBNF grammars."""
    name = OUTLINES

    def __init__(self, tokenizer_json: str, vocab: Sequence[bytes], eos_id: int) -> None:
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema
        self._oc, self._to_regex = outlines_core, build_regex_from_schema
        tokens: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(vocab):
            if data and token_id != eos_id:
                tokens.setdefault(data, []).append(token_id)
        self._vocabulary = outlines_core.Vocabulary(eos_id, tokens)
        self._mask = torch.zeros(-(-len(vocab) // 32), dtype=torch.int32)

    def supports(self, constraint: Constraint) -> bool:
        return constraint.kind != "grammar"

    def compile(self, constraint: Constraint) -> Any:
        regex = constraint.spec
        if constraint.kind == "json_schema":
            # An optional space: its regex has no separators of its own, and ", " / ": " must
            # pass (a slightly larger language than the others', and no slower for it).
            regex = self._to_regex(constraint.spec, whitespace_pattern=" ?")
        return self._oc.Guide(self._oc.Index(regex, self._vocabulary))

    def replay(self, guide: Any, tokens: Sequence[int]) -> list[float]:
        pointer, size = self._mask.data_ptr(), self._mask.numel()

        def advance(token: int) -> bool:
            try:
                guide.advance(token, return_tokens=False)
            except ValueError:  # its way of refusing a token
                return False
            return True

        return timed_replay(self.name, tokens, lambda: guide.write_mask_into(pointer, size, 4),
                            advance)


def timed_replay(name: str, tokens: Sequence[int], fill: Callable[[], object],
                 accept: Callable[[int], bool]) -> list[float]:
    """Engine.replay for any engine: `fill` computes the next mask, `accept` takes a token
    (False: refused). Each time covers one mask and the token after it; the last, the mask
    after the last token."""
    times = []
    for token in [*tokens, None]:
        start = time.perf_counter()
        fill()
        accepted = token is None or accept(token)
        times.append(time.perf_counter() - start)
        if not accepted:
            raise Refused(f"{name} refused token {token} at {len(times) - 1}")
    return times
