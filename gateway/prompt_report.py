"""What a request gets back of its own prompt: the tokens, the text to echo, and the scores.

Completions' `echo` returns the prompt before the completion; `prompt_logprobs` (and `echo` with
`logprobs`) returns how likely the model found each prompt token. The executor scores the
prompt while it computes it (executor_service/engine/prompt_logprobs.py) and sends the scores
once, by the first token's update at the latest; the generation's first event carries them.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.choice_stream import TokenLogprob, logprob_with_text
from gateway.detokenizer import IncrementalDetokenizer
from gateway.tokenizer import GatewayTokenizer


@dataclass(frozen=True, slots=True)
class PromptReport:
    token_ids: list[int]
    # The prompt as it is echoed: the text a text prompt was given as, else its tokens
    # decoded (special tokens kept, as they are part of what the model read).
    text: str
    # One per prompt token, the first with logprob None (nothing before it to score it on);
    # None when the request did not ask for them.
    logprobs: list[TokenLogprob] | None = None
    # With logprobs: where each prompt token starts in the prompt's decoded text.
    text_offsets: list[int] = field(default_factory=list)


def prompt_report(tokenizer: GatewayTokenizer, token_ids: list[int], text: str | None,
                  scored: Iterable | None) -> PromptReport:
    """`scored`: the executor's TokenLogprob messages for prompt tokens 1 .. P-1."""
    if text is None:
        text = tokenizer.decode(token_ids, skip_special_tokens=False)
    if scored is None:
        return PromptReport(token_ids, text)
    first = tokenizer.decode(token_ids[:1], skip_special_tokens=False)
    logprobs = [TokenLogprob(token_ids[0], first, None, ()),
                *(logprob_with_text(tokenizer, entry) for entry in scored)]
    _, offsets = IncrementalDetokenizer(tokenizer.tokenizer).add_with_offsets(token_ids)
    return PromptReport(token_ids, text, logprobs, offsets)
