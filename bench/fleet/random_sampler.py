"""The simulated executor's sampler: seeded random tokens, whatever the logits.

The allocator sees only token ids (it hashes full blocks); random ones make every generated
block unique, as real text mostly is. The simulated requests never stop on a token (the engine
is given no end-of-sequence ids): they end at max_tokens or when cancelled.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from executor_service.engine.sampler import SampleOutput, SamplingRow


class RandomSampler:
    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SampleOutput:
        # One draw for the batch: a GPU's sampler costs its host about this little, where a
        # Python draw per row took 0.1 ms of the simulated executor's CPU an iteration.
        tokens = torch.randint(self.vocab_size, (len(rows),), generator=self.generator)
        return SampleOutput(tokens.tolist(), [None] * len(rows))
