"""A request as the engine holds it, and the sequences it generates (one per choice: n > 1
forks the rest from the first; beam search keeps one per beam). Each sequence points back at
its request, so the two live in one module.

A sequence holds its tokens, how many have K/V in the cache, and the block
table the allocator granted it (mirrored here so the forward pass never asks).

A sequence is one uniform thing from admission to its end:

    token_ids:  [ prompt ............................ | generated ...... ]
                  0                 num_computed          len(token_ids)
                  └─ K/V in the cache ─┘└─ still to compute ─┘

While more than one token is still to compute it is *prefilling* (a prompt, a chunk of one,
or a recompute after preemption); with exactly one it is *decoding*: the last sampled token is
computed and the next one sampled. `num_reported` counts the tokens the allocator has recorded;
the ones after it travel in the next Append.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from executor_service.engine.beam_search import BeamSearch, Hypothesis
from executor_service.engine.request_output import TokenLogprob
from executor_service.engine.token_counts import TokenCounts
from pagedserve.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from llguidance import LLMatcher


class SequenceStatus(enum.Enum):
    WAITING = "waiting"      # no blocks: not admitted yet, or preempted
    RUNNING = "running"      # holds blocks on the allocator
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: str
    request: Request
    index: int                                   # the choice index among the request's n
                                                 # (0 for every beam: beams are not choices)
    token_ids: list[int]
    num_prompt_tokens: int
    generator: torch.Generator | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    # Counts in-place changes of block_table's entries (copy-on-write), which the model
    # runner's table buffer must see; a new list is seen by its identity.
    table_edits: int = 0
    num_computed: int = 0
    num_reported: int = 0
    num_cached_tokens: int = 0                   # prompt tokens served from the prefix cache
    # A request scoring its prompt recomputes the tokens it found in the prefix cache, to
    # read their logits: positions below this hold K/V in shared cached blocks, which the
    # recompute reads and does not write again (prompt_logprobs.py).
    rescore_below: int = 0
    # The last block may be shared with a fork sibling: the next write may copy it first,
    # which only the allocator's answer tells.
    may_copy_on_write: bool = False
    # Set on a child of an `n > 1` request until the Fork that gives it its parent's blocks.
    fork_parent: Sequence | None = None
    finish_reason: str | None = None
    # A best_of sample, whose tokens are reported only if it ranks among the n best: the sum
    # of its tokens' logprobs, and each token's logprobs where the request asks for them.
    cumulative_logprob: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # The penalties' token counts, made at the first sampling of a request that has any.
    token_counts: TokenCounts | None = None
    # Structured output: the grammar's state after this sequence's generated tokens
    # (grammar.py); None for free text.
    matcher: LLMatcher | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def is_running(self) -> bool:
        return self.status is SequenceStatus.RUNNING

    @property
    def is_decoding(self) -> bool:
        return self.num_uncomputed == 1

    def capacity(self, block_size: int) -> int:
        """Token slots the mirrored block table covers."""
        return len(self.block_table) * block_size

    def slot(self, position: int, block_size: int) -> int:
        return self.block_table[position // block_size] * block_size + position % block_size

    def replace_block(self, old: int, new: int) -> None:
        """A copy-on-write: the allocator copied shared block `old` to `new`, ours alone."""
        self.block_table[self.block_table.index(old)] = new
        self.table_edits += 1

    def release_blocks(self) -> None:
        """Back to waiting with nothing cached: after a Free, the next admission recomputes
        every token (from the prefix cache where the allocator still has them)."""
        self.status = SequenceStatus.WAITING
        self.block_table = []
        self.num_computed = self.num_reported = self.rescore_below = 0
        self.may_copy_on_write = False


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
    # Beam search: the decisions (beam_search.py), and which sequence holds which beam.
    beams: Beams | None = None
    # SamplingParams.prompt_logprobs: prompt tokens 1, 2, ... as far as they are scored, and
    # whether they went out (once, when all are in).
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs_reported: bool = False
    # The choices as they are returned when they are decided only at the end (beam search,
    # best_of): best first.
    final_choices: list[Hypothesis] | None = None

    @property
    def finished(self) -> bool:
        return all(seq.status is SequenceStatus.FINISHED for seq in self.sequences)

    def detach(self) -> None:
        """Drops the links from the request to its sequences (each sequence points back at its
        request, and a beam search's order lists them: reference cycles). The engine calls this
        once it has reported the request's end, so reference counting frees the whole request
        then, instead of the cyclic collector's full pass later (a pause of ~10 ms per 10,000
        live objects: executor_service/heap.py)."""
        self.sequences = []
        self.beams = None

    @property
    def scoring_prompt(self) -> bool:
        """Whether prompt tokens are still to be scored: the prompt's logits are wanted."""
        return (self.params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1)


@dataclass(slots=True, eq=False)
class Beams:
    """A beam-search request's running beams. `order` lists the sequence holding each beam, in
    the order of the last decision (best first; at the start every beam is the prompt's one
    sequence). A beam's next-token log-probabilities wait in `rows` until every beam has
    them: after a preemption the beams are recomputed separately and finish apart."""
    search: BeamSearch
    order: list[Sequence]
    rows: dict[Sequence, torch.Tensor] = field(default_factory=dict)

    def ready(self) -> bool:
        return all(seq in self.rows for seq in self.order)
