"""What the engine needs from its forward pass and its sampler.

The serving engine runs `ModelRunner` (a model over the paged KV cache) and `Sampler`. The fleet
simulator (bench/fleet/) runs the same engine, scheduler and allocator protocol with a forward
pass that only waits and a sampler that draws seeded random tokens: the allocator cannot tell
the difference, which is what that benchmark needs.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import torch

from executor_service.engine.request import Sequence
from executor_service.engine.sampler import SampleOutput, SamplingRow


class ForwardPass(Protocol):
    # Where the logits (and the seeded requests' generators) live.
    device: torch.device

    def execute(self, work: list[tuple[Sequence, int]], copies: list[tuple[int, int]]
                ) -> tuple[torch.Tensor | None, list[Sequence]]:
        """Runs the copy-on-write copies, then computes `chunk` tokens of each sequence (moving
        its computed mark); returns the logits of the sequences that now need a token, and
        those sequences."""


class TokenSampler(Protocol):
    def sample(self, logits: torch.Tensor, rows: Seq[SamplingRow]) -> SampleOutput:
        """Row i's next token, from row i of `logits`."""
