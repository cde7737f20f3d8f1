"""The iteration's grammar masks, computed on a worker thread while the forward pass runs.

A mask depends only on the tokens its sequence has already accepted, never on this
iteration's logits, so it can be computed as soon as the iteration knows which sequences it
will sample. The engine starts it just before `runner.execute` and waits for it just before
sampling: the mask's CPU time (tens of microseconds a sequence, more for a large vocabulary or
a complex schema) hides behind the forward pass instead of adding to every token's latency.
llguidance drops the GIL while it computes, so the overlap is real on the CPU too.

    main thread:   plan ── start masks ── execute (forward pass) ──── wait ── sample
    mask thread:                 └── fill bitmask rows ──────┘

The mask is a bitmask, one bit per vocabulary id in int32 words ([rows, ceil(vocab / 32)]),
the layout llguidance (and xgrammar) fill; the sampler expands it on the logits' device.
"""
from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
# llguidance's numpy helpers, not its torch ones: importing llguidance.torch runs a
# torch.compile decorator, which imports dynamo and inductor (1 to 2 s of CPU at every executor
# start, grammar or not). The masks live on the CPU, where a tensor's numpy view is its memory.
import llguidance.numpy as llg_numpy
import torch

from executor_service.engine.request import Sequence


class TokenMasks:
    """One iteration's masks, by sequence; `row` is None for an unconstrained sequence."""

    def __init__(self, vocab_size: int = 0, rows: dict[Sequence, int] | None = None,
                 bitmask: torch.Tensor | None = None, done: Future | None = None) -> None:
        self.vocab_size = vocab_size
        self._rows = rows or {}
        self._bitmask = bitmask
        self._done = done

    def wait(self) -> TokenMasks:
        if self._done is not None:
            self._done.result()
            self._done = None
        return self

    def row(self, seq: Sequence) -> torch.Tensor | None:
        """Sequence `seq`'s bitmask row ([words] int32, on the CPU), None when it has no
        grammar; call after wait(). A constrained sequence the engine did not foresee
        sampling gets its mask computed now: late, never missing."""
        assert self._done is None, "masks read before they were computed"
        index = self._rows.get(seq)
        if index is not None:
            return self._bitmask[index]
        if seq.matcher is None:
            return None
        bitmask = torch.full(llg_numpy.get_bitmask_shape(1, self.vocab_size), -1,
                             dtype=torch.int32)
        llg_numpy.fill_next_token_bitmask(seq.matcher, bitmask.numpy())
        return bitmask[0]


# An engine without a grammar compiler: no sequence has a matcher.
NO_MASKS = TokenMasks()


class TokenMaskWorker:
    """Fills the constrained sequences' masks on one background thread; llguidance's executor
    spreads a batch of matchers over its own CPU threads."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="token-mask")
        self._executor = llguidance.LLExecutor()

    def start(self, sequences: Iterable[Sequence]) -> TokenMasks:
        """Begins computing the masks of the sequences that have a matcher; the engine calls
        wait() on the result before sampling and must not advance those matchers before."""
        matchers = [seq for seq in sequences if seq.matcher is not None]
        if not matchers:
            return TokenMasks(self.vocab_size)
        bitmask = torch.full(llg_numpy.get_bitmask_shape(len(matchers), self.vocab_size),
                             -1, dtype=torch.int32)
        pairs = [(seq.matcher, index) for index, seq in enumerate(matchers)]
        done = self._thread.submit(llg_numpy.fill_next_token_bitmask_par,
                                   self._executor, pairs, bitmask.numpy())
        return TokenMasks(self.vocab_size, {seq: index for index, seq in enumerate(matchers)},
                          bitmask, done)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
