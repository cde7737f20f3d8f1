"""One forward pass over an iteration's work: the copy-on-write copies first, then the model
over the flattened batch (step_inputs.py lays it out), and the logits of every sequence that
reached the end of its tokens (a decode, or the last chunk of a prompt)."""
from __future__ import annotations

import torch

import kernels
from executor_service.engine.request import Sequence
from executor_service.engine.step_inputs import StepInputs
from executor_service.model.causal_lm import CausalLM


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, inputs: StepInputs) -> None:
        self.model, self.kv_cache, self.inputs = model, kv_cache, inputs
        self.device = kv_cache.device

    def execute(self, work: list[tuple[Sequence, int]], copies: list[tuple[int, int]]
                ) -> tuple[torch.Tensor | None, list[Sequence]]:
        """Computes `chunk` tokens of each sequence from its computed mark on. Returns the fp32
        logits `[rows, vocab]` of the sequences that now need a token, and those sequences."""
        if copies:
            kernels.copy_blocks(self.kv_cache, copies)
        if not work:
            return None, []
        decode = [seq for seq, chunk in work if seq.is_decoding]
        prefill = [(seq, chunk) for seq, chunk in work if not seq.is_decoding]
        inputs = self.inputs.prepare(decode, prefill)
        hidden = self.model(inputs.token_ids, inputs.positions, self.kv_cache, inputs.batch)
        for seq in decode:
            seq.num_computed += 1
        for seq, chunk in prefill:
            seq.num_computed += chunk
        sampled = inputs.sampled
        if not sampled:
            return None, []
        rows = hidden[:len(sampled)] if inputs.sample_rows is None else \
            hidden[inputs.sample_rows]
        return self.model.logits(rows).float(), sampled
