"""Choosing the executor for a request: exact prefix overlap against load.

The allocator's MatchPrefix tells, for every executor, how many of the prompt's tokens its pool
already holds (exactly: it owns the block hashes) and how full the pool is. Each executor of
the request's model gets a score, and the best one serves it:

    score = overlap − KV_WEIGHT · kv_usage − LOAD_WEIGHT · load_share

    overlap     cached prompt tokens / prompt tokens, in [0, 1]: compute the hit saves
    kv_usage    used blocks / blocks, in [0, 1]: a full pool preempts and evicts
    load_share  this gateway's open requests there / (all its open requests + 1), in [0, 1)

An executor is overloaded when its pool is nearly full or its queue is long; its overlap then
counts for nothing, so a hot prefix does not pile every request onto one executor. Ties go to
the executor with fewer open requests, then to the lower id, so routing is deterministic.

Why these weights: a prompt that is fully cached on one executor (overlap 1) stays there until
that executor carries about all of this gateway's open requests or its pool is full. Between
executors with equal overlap, load decides; KV usage only matters at half the weight, because a
pool full of cached-free blocks is healthy.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KV_WEIGHT = 0.5
LOAD_WEIGHT = 1.0
# Overloaded: at least this share of the pool in use, or this many requests queued.
OVERLOAD_KV_USAGE = 0.95
OVERLOAD_WAITING = 8


@dataclass(frozen=True, slots=True)
class Candidate:
    executor_id: str
    # Prompt tokens its pool already holds (from MatchPrefix).
    cached_tokens: int
    free_blocks: int
    num_blocks: int
    # Requests waiting for admission there, from its last heartbeat.
    num_waiting: int
    # Requests this gateway has open there now.
    num_open: int

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.num_blocks if self.num_blocks else 1.0

    @property
    def overloaded(self) -> bool:
        return self.kv_usage >= OVERLOAD_KV_USAGE or self.num_waiting >= OVERLOAD_WAITING


def score(candidate: Candidate, prompt_len: int, total_open: int) -> float:
    overlap = 0.0 if candidate.overloaded or prompt_len == 0 else \
        min(1.0, candidate.cached_tokens / prompt_len)
    load_share = candidate.num_open / (total_open + 1)
    return overlap - KV_WEIGHT * candidate.kv_usage - LOAD_WEIGHT * load_share


def choose(candidates: Sequence[Candidate], prompt_len: int) -> Candidate:
    """The best executor for a prompt of `prompt_len` tokens; candidates must not be empty."""
    if not candidates:
        raise ValueError("no executor to choose from")
    total_open = sum(candidate.num_open for candidate in candidates)
    return max(candidates, key=lambda c: (score(c, prompt_len, total_open), -c.num_open,
                                          _descending(c.executor_id)))


def _descending(text: str) -> tuple[int, ...]:
    """A key that sorts strings in reverse, so max() prefers the lower id on a tie."""
    return tuple(-ord(character) for character in text) + (0,)
