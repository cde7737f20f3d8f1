"""One forward pass over an iteration's work: the copy-on-write copies first, then the model
over the flattened batch (step_inputs.py lays it out), and the logits of every sequence that
reached the end of its tokens (a decode, or the last chunk of a prompt). A pure decode replays
a captured CUDA graph when the engine has them (cuda_graphs.py). The prompt positions of
requests that score their prompt are scored here too, from the same hidden states
(prompt_logprobs.py)."""
from __future__ import annotations

import torch

import kernels
from executor_service.engine import prompt_logprobs
from executor_service.engine.cuda_graphs import DecodeGraphs
from executor_service.engine.request import Sequence
from executor_service.engine.step_inputs import StepInputs
from executor_service.model.causal_lm import CausalLM


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, inputs: StepInputs) -> None:
        self.model, self.kv_cache, self.inputs = model, kv_cache, inputs
        self.device = kv_cache.device
        self.graphs: DecodeGraphs | None = None
        # Iterations that replayed a graph, for the tests and the logs.
        self.graph_replays = 0

    def capture_decode_graphs(self, max_num_seqs: int) -> float:
        """Captures the decode graphs (CUDA only); returns the seconds taken."""
        self.graphs = DecodeGraphs(self.model, self.kv_cache, self.inputs, max_num_seqs)
        return self.graphs.capture()

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
        graph = self.graphs.bucket(len(decode), len(prefill)) if self.graphs else None
        inputs = self.inputs.prepare(decode, prefill, pad_decode_to=graph)
        if graph is None:
            hidden = self.model(inputs.token_ids, inputs.positions, self.kv_cache, inputs.batch)
        else:
            hidden = self.graphs.replay(graph)
            self.graph_replays += 1
        for seq in decode:
            seq.num_computed += 1
        for seq, chunk in prefill:
            seq.num_computed += chunk
        if inputs.prompt_spans:
            prompt_logprobs.score(hidden, self.model.logits, inputs.prompt_spans)
        sampled = inputs.sampled
        if not sampled:
            return None, []
        rows = hidden[:len(sampled)] if inputs.sample_rows is None else \
            hidden[inputs.sample_rows]
        return self.model.logits(rows).float(), sampled
