"""What the memory benchmark records about every scheme the same way: one sample of the KV cache
after each iteration, and the averages over the saturated period and over the whole run.

A sample is taken after an iteration has computed its tokens, before the next one starts:

    sequences  the sequences holding KV memory (those that finished in this iteration included:
               their memory goes back at the start of the next one, before anything is admitted)
    tokens     the tokens they hold: every prompt token from admission on (a prompt computed in
               chunks counts whole from the start, as the allocator records it), then one more
               per decode iteration. The token sampled last has no K/V yet and is not counted.
    slots      the KV slots allocated to them: a reservation, or blocks × block size

The saturated period is the iterations after which requests were still waiting: the cache is
the only thing keeping them out, so that is where a scheme's use of memory shows.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

CONTIGUOUS = "contiguous"
POW2 = "pow2"


def paged_name(block_size: int) -> str:
    return f"paged-{block_size}"


@dataclass(frozen=True, slots=True)
class Sample:
    # Requests were still waiting after this iteration.
    saturated: bool
    sequences: int
    tokens: int
    slots: int


@dataclass(slots=True)
class SchemeRun:
    name: str
    label: str
    budget_slots: int
    samples: list[Sample] = field(default_factory=list)
    # Requests that finished with every token they asked for (the sanity check).
    completed: int = 0
    preemptions: int = 0
    # Paged runs: samples checked against the admin API's pool statistics, and how many agreed.
    checked: int = 0
    agreed: int = 0
    wall_s: float = 0.0

    def period(self, whole_run: bool = False) -> list[Sample]:
        """The saturated samples, or every sample; the whole run when none was saturated."""
        saturated = [sample for sample in self.samples if sample.saturated]
        return self.samples if whole_run or not saturated else saturated

    def slot_share(self, whole_run: bool = False) -> float:
        """Of the slot-iterations allocated, the share holding a token."""
        samples = self.period(whole_run)
        slots = sum(sample.slots for sample in samples)
        return sum(sample.tokens for sample in samples) / slots if slots else 0.0

    def budget_share(self, whole_run: bool = False) -> float:
        """Of the whole KV budget, iteration by iteration, the share holding a token."""
        samples = self.period(whole_run)
        return sum(sample.tokens for sample in samples) / (self.budget_slots * len(samples))

    def mean_sequences(self, whole_run: bool = False) -> float:
        return statistics.fmean(sample.sequences for sample in self.period(whole_run))

    def max_sequences(self, whole_run: bool = False) -> int:
        return max(sample.sequences for sample in self.period(whole_run))

    @property
    def num_iterations(self) -> int:
        return len(self.samples)

    @property
    def num_saturated(self) -> int:
        return sum(sample.saturated for sample in self.samples)
