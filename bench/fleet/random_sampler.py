"""The simulated executor's sampler: seeded random tokens, whatever the logits.

The allocator sees only token ids (it hashes full blocks); random ones make every generated
block unique, as real text mostly is. The simulated requests never stop on a token (the engine
is given no end-of-sequence ids): they end at max_tokens or when cancelled.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from executor_service.engine.sampler import SampleOutput, SamplingRow


class RandomSampler:
    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SampleOutput:
        draw = self.rng.randrange
        return SampleOutput([draw(self.vocab_size) for _ in rows], [None] * len(rows))
