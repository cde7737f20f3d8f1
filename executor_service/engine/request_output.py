"""What the engine reports about a request after each step: the tokens each choice gained (with
logprobs when asked), why a choice finished, and the usage once the whole request is done."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    # The token's rank in its position's distribution (1: the most likely); reported for
    # prompt tokens, as vLLM reports them.
    rank: int | None = None


@dataclass(slots=True)
class SequenceDelta:
    """New tokens of one choice since the last report."""
    index: int
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None     # "stop", "length", "cancelled", "error"
    # For a choice decided at the end (beam search, best_of): the sum of its tokens'
    # log-probabilities, and the score it was ranked by (beam search: length-penalised).
    cumulative_logprob: float | None = None
    score: float | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    deltas: list[SequenceDelta]
    finished: bool = False
    usage: Usage | None = None           # on the last output of a request
    error: str | None = None
    # Once, when the prompt has been scored (SamplingParams.prompt_logprobs): prompt tokens
    # 1 .. P-1 (the first has nothing before it to be scored on).
    prompt_logprobs: list[TokenLogprob] | None = None
