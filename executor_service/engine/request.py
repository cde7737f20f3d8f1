"""A request as the engine holds it, and what the engine reports about it after each step."""
from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.common.sampling_params import SamplingParams
from executor_service.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str = ""
    arrival: int = 0                        # submission order
    admitted: int = -1                      # admission order; the latest is preempted first
    sequences: list[Sequence] = field(default_factory=list)
    # n > 1: the children are forked from sequence 0 once its prompt is computed.
    forked: bool = False
    cancelled: bool = False
    error: str | None = None
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return all(seq.status is SequenceStatus.FINISHED for seq in self.sequences)


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class SequenceDelta:
    """New tokens of one choice since the last report."""
    index: int
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None     # "stop", "length", "cancelled", "error"


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
