"""One forward pass over an iteration's work: the flattened batch, its slots and block tables
as tensors, the copy-on-write copies first, and the logits of every sequence that reached the
end of its tokens (a decode, or the last chunk of a prompt)."""
from __future__ import annotations

import torch

import kernels
from executor_service.engine.request import Sequence
from executor_service.model.attention_batch import AttentionBatch
from executor_service.model.causal_lm import CausalLM


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, block_size: int) -> None:
        self.model, self.kv_cache, self.block_size = model, kv_cache, block_size
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
        ordered = [(seq, 1) for seq in decode] + prefill

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        block_size = self.block_size
        # Decode rows first, one token each, every one sampled: the bulk of a steady iteration,
        # so without the general loop's slices and ranges.
        for seq in decode:
            position = seq.num_computed
            input_ids.append(seq.token_ids[position])
            positions.append(position)
            slots.append(seq.block_table[position // block_size] * block_size
                         + position % block_size)
        sampled: list[Sequence] = list(decode)
        sample_rows: list[int] = list(range(len(decode)))
        for seq, chunk in prefill:
            start = seq.num_computed
            input_ids += seq.token_ids[start:start + chunk]
            span = range(start, start + chunk)
            positions += span
            slots += [seq.slot(position, self.block_size) for position in span]
            if start + chunk == len(seq.token_ids):
                sampled.append(seq)
                sample_rows.append(len(input_ids) - 1)

        batch = self._attention_batch(decode, prefill, slots)
        hidden = self.model(self._tensor(input_ids, torch.int64),
                            self._tensor(positions, torch.int64), self.kv_cache, batch)
        for seq, chunk in ordered:
            seq.num_computed += chunk
        if not sampled:
            return None, []
        rows = self._tensor(sample_rows, torch.int64)
        return self.model.logits(hidden[rows]).float(), sampled

    def _attention_batch(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]],
                         slots: list[int]) -> AttentionBatch:
        starts = [0]
        for _, chunk in prefill:
            starts.append(starts[-1] + chunk)
        prefill_lens = [seq.num_computed + chunk for seq, chunk in prefill]
        return AttentionBatch(
            slot_mapping=self._tensor(slots, torch.int64),
            num_decode_tokens=len(decode),
            decode_block_tables=self._tables(decode),
            decode_context_lens=self._tensor([seq.num_computed + 1 for seq in decode],
                                             torch.int32),
            max_decode_context=max((seq.num_computed + 1 for seq in decode), default=0),
            prefill_block_tables=self._tables([seq for seq, _ in prefill]),
            prefill_query_start=self._tensor(starts, torch.int32),
            prefill_seq_lens=self._tensor(prefill_lens, torch.int32),
            max_prefill_query=max((chunk for _, chunk in prefill), default=0),
            max_prefill_seq=max(prefill_lens, default=0),
        )

    def _tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max((len(seq.block_table) for seq in seqs), default=0)
        rows = [seq.block_table + [-1] * (width - len(seq.block_table)) for seq in seqs]
        return torch.tensor(rows, dtype=torch.int32).reshape(len(seqs), width).to(self.device)

    def _tensor(self, values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)
