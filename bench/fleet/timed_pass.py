"""The simulated executor's forward pass: no model, only the time one would take.

A GPU runs the forward pass while the CPU plans the next iteration, so an iteration lasts
`iteration_s` however long the planning took (unless the planning alone took longer): each pass
ends `iteration_s` after the previous one ended, or after now when the CPU fell behind. The Step
an iteration overlaps with its pass has until then, and the sampling after it, to be answered
without delaying anything.
"""
from __future__ import annotations

import time

import torch

from bench.memory.paged import StandInRunner
from executor_service.engine.request import Sequence


class TimedForwardPass:
    def __init__(self, iteration_s: float) -> None:
        self.iteration_s = iteration_s
        self.device = torch.device("cpu")
        # Passes run, and when the last one ended (time.monotonic()).
        self.passes = 0
        self.ended_at = 0.0
        # Computed marks and the sequences to sample, as the memory benchmark keeps them; the
        # random sampler reads no logits, so one column stands for them.
        self.bookkeeping = StandInRunner(vocab_size=1)

    def execute(self, work: list[tuple[Sequence, int]], copies: list[tuple[int, int]]
                ) -> tuple[torch.Tensor | None, list[Sequence]]:
        self.passes += 1
        now = time.monotonic()
        # Planning took less than a pass: it overlapped the previous one. Otherwise (or after
        # an idle spell) this pass starts now.
        start = self.ended_at if now - self.ended_at <= self.iteration_s else now
        end = start + self.iteration_s
        time.sleep(max(0.0, end - time.monotonic()))
        self.ended_at = time.monotonic()
        return self.bookkeeping.execute(work, copies)
