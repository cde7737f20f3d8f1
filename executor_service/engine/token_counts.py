"""A sequence's token occurrences for the sampling penalties, kept up to date as tokens arrive.

The repetition penalty needs the set of tokens in the prompt or the output; presence and
frequency need each output token's count. Counting from the token lists every iteration costs
time in proportion to the sequence's length, every token. Kept here instead, a new token costs
one increment, and the sampler stacks the rows' vectors.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


class TokenCounts:
    def __init__(self, vocab_size: int, prompt_token_ids: Sequence[int],
                 device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.in_prompt[self._ids(prompt_token_ids, device)] = True
        # float32 counts stay exact below 2**24 occurrences.
        self.output = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self.num_counted = 0  # output tokens counted so far

    @classmethod
    def of(cls, vocab_size: int, prompt_token_ids: Sequence[int],
           output_token_ids: Sequence[int], device: torch.device | str) -> TokenCounts:
        counts = cls(vocab_size, prompt_token_ids, device)
        counts.catch_up(output_token_ids, 0)
        return counts

    def catch_up(self, token_ids: Sequence[int], first_output: int) -> None:
        """Counts the output tokens (`token_ids` from `first_output` on) not yet counted: the
        list only grows, and only its new tail is read."""
        new = token_ids[first_output + self.num_counted:]
        if len(new) == 1:
            self._check(new[0], new[0])
            self.output[new[0]] += 1
        elif new:
            ids = self._ids(new, self.output.device)
            self.output.index_add_(0, ids, torch.ones(len(new), device=self.output.device))
        self.num_counted = len(token_ids) - first_output

    def seen(self) -> torch.Tensor:
        """[vocab] bool: the tokens in the prompt or the output (the repetition penalty's)."""
        return self.in_prompt | (self.output > 0)

    def _ids(self, token_ids: Sequence[int], device: torch.device | str) -> torch.Tensor:
        ids = torch.as_tensor(list(token_ids), dtype=torch.long)
        if ids.numel():
            self._check(int(ids.min()), int(ids.max()))
        return ids.to(device)

    def _check(self, low: int, high: int) -> None:
        # An out-of-range id would index another token or fail deep inside torch.
        if low < 0 or high >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {low}..{high}")
