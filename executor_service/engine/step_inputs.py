"""The forward pass's inputs, kept in buffers that are allocated once and then written in place.

Block tables are the large input: a row per sequence, a column per block. Every running
sequence owns a row of a persistent table buffer. The row is written in full when the
sequence first runs, and afterwards only where the sequence's table changed: a new block
appends one entry, and a copy-on-write or a new table (admission after a preemption) rewrites
the row. An iteration's block tables are the rows of the sequences it runs, gathered by one
`index_select`. Before this, every iteration rebuilt every table from Python lists.

The per-token inputs (token ids, positions, slots) and the per-sequence ones (context lengths,
query starts) are written into preallocated buffers through numpy views. On a GPU each buffer
then crosses in one host-to-device copy from pinned memory into a device buffer that is also
allocated once (mirrored_buffer.py), gathered block tables included: the decode CUDA graphs
(cuda_graphs.py) were captured on those device buffers, and a pure decode padded to a graph's
batch size (`pad_decode_to`) is ready for replay once prepared. On the CPU the buffers are the
inputs and nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from executor_service.engine.mirrored_buffer import MirroredBuffer
from executor_service.engine.prompt_logprobs import PromptSpan, span_of
from executor_service.engine.request import Sequence
from executor_service.model.attention_batch import AttentionBatch


@dataclass(slots=True)
class ForwardInputs:
    token_ids: torch.Tensor               # [tokens] int64
    positions: torch.Tensor               # [tokens] int64
    batch: AttentionBatch
    # Sequences that reach the end of their tokens this pass (every decode row, and prefills
    # on their last chunk), and their rows of the hidden states; None: the first
    # len(sampled) rows (the decode rows, when no prefill ends).
    sampled: list[Sequence]
    sample_rows: torch.Tensor | None
    # Prompt positions whose logits score the prompt (requests asking for prompt logprobs).
    prompt_spans: list[PromptSpan]


@dataclass(slots=True)
class _Row:
    index: int
    table: list[int]      # the list object mirrored: another one means a new table
    edits: int            # the sequence's table_edits when mirrored
    written: int          # entries of that list already in the row


class StepInputs:
    def __init__(self, max_num_seqs: int, max_num_tokens: int, max_blocks_per_seq: int,
                 block_size: int, device: torch.device) -> None:
        self.block_size, self.device = block_size, device
        self._mirrored = device.type == "cuda"
        # Marks when the last iteration's copies out of the pinned buffers were done: they
        # run asynchronously, and the next iteration writes into the same buffers.
        self._copied: torch.cuda.Event | None = None
        # Bumped whenever a device buffer is replaced by a larger one: what a CUDA graph
        # captured at an older generation reads is gone.
        self.generation = 0
        self._rows: dict[Sequence, _Row] = {}
        self._tables = torch.full((max_num_seqs, max_blocks_per_seq), -1, dtype=torch.int32,
                                  pin_memory=self._mirrored)
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))  # pop() takes the lowest
        self._allocate_token_buffers(max_num_tokens)
        self._allocate_seq_buffers(max_num_seqs, max_blocks_per_seq)

    # -- buffers --------------------------------------------------------------------------------

    def _buffer(self, shape, dtype: torch.dtype, fill: int = 0) -> MirroredBuffer:
        return MirroredBuffer(shape, dtype, self.device, fill)

    # The buffers are normal tensors even when grown inside inference mode (a CUDA-graph
    # capture reserves its largest batch there): an inference tensor refuses the in-place
    # writes of every later step, which runs outside it.
    @torch.inference_mode(False)
    def _allocate_token_buffers(self, size: int) -> None:
        self._token_ids = self._buffer((size,), torch.int64)
        self._positions = self._buffer((size,), torch.int64)
        self._slots = self._buffer((size,), torch.int64, fill=-1)
        self._sample_rows = self._buffer((size,), torch.int64)
        self.generation += 1

    @torch.inference_mode(False)
    def _allocate_seq_buffers(self, size: int, width: int) -> None:
        self._context_lens = self._buffer((size,), torch.int32)
        self._seq_lens = self._buffer((size,), torch.int32)
        self._query_start = self._buffer((size + 1,), torch.int32)
        self._row_index = torch.zeros(size, dtype=torch.int64)
        # Gathered block tables, one set for the decode rows and one for the prefill rows.
        self._decode_tables = self._buffer((size, width), torch.int32, fill=-1)
        self._prefill_tables = self._buffer((size, width), torch.int32, fill=-1)
        self.generation += 1

    def _reserve(self, num_tokens: int, num_seqs: int, width: int) -> None:
        """The scheduler keeps within the sizes given; grow rather than fail if it did not."""
        if num_tokens > len(self._token_ids):
            self._allocate_token_buffers(max(num_tokens, 2 * len(self._token_ids)))
        seqs, capacity = len(self._context_lens), self._decode_tables.host.shape[1]
        if num_seqs > seqs or width > capacity:
            self._allocate_seq_buffers(max(num_seqs, seqs), max(width, capacity))

    # -- block-table rows -----------------------------------------------------------------------

    def _row(self, seq: Sequence) -> int:
        """`seq`'s row in the table buffer, brought up to date with its block table."""
        row = self._rows.get(seq)
        table = seq.block_table
        if row is None:
            row = self._rows[seq] = _Row(self._take_row(), table, seq.table_edits, 0)
            # A reused row still holds its last owner's blocks: padding must read -1.
            self._tables[row.index] = -1
        elif row.table is not table or row.edits != seq.table_edits:
            row.table, row.edits, row.written = table, seq.table_edits, 0
            self._tables[row.index] = -1
        if row.written < len(table):
            if len(table) > self._tables.shape[1]:
                self._widen(len(table))
            self._tables.numpy()[row.index, row.written:len(table)] = table[row.written:]
            row.written = len(table)
        return row.index

    def _take_row(self) -> int:
        if not self._free_rows:
            # Rows of sequences that stopped running (finished, preempted) are taken back
            # lazily, when one is needed; a steady decode never gets here.
            for seq in [seq for seq, row in self._rows.items() if not seq.is_running]:
                self._free_rows.append(self._rows.pop(seq).index)
            self._free_rows.sort(reverse=True)
        if not self._free_rows:
            rows = self._tables.shape[0]
            self._tables = torch.cat([self._tables, torch.full_like(self._tables, -1)])
            if self._mirrored:
                self._tables = self._tables.pin_memory()
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))
        return self._free_rows.pop()

    def _widen(self, width: int) -> None:
        wider = torch.full((self._tables.shape[0], max(width, 2 * self._tables.shape[1])), -1,
                           dtype=torch.int32, pin_memory=self._mirrored)
        wider[:, :self._tables.shape[1]] = self._tables
        self._tables = wider

    def _gather_tables(self, target: MirroredBuffer, rows: list[int], width: int,
                       start: int) -> torch.Tensor:
        """The rows' tables, `width` blocks wide, as a [len(rows), width] tensor: on a GPU the
        first rows and columns of `target`'s device buffer (whose row stride stays its full
        width, as the graphs captured it)."""
        index = self._row_index[start:start + len(rows)]
        index.numpy()[:] = rows
        tables = self._tables[:, :width]
        if not target.mirrored:
            return tables.index_select(0, index)
        staging = target.host.view(-1)[:len(rows) * width].view(len(rows), width)
        torch.index_select(tables, 0, index, out=staging)
        gathered = target.device[:len(rows), :width]
        gathered.copy_(staging, non_blocking=True)
        return gathered

    # -- one iteration --------------------------------------------------------------------------

    def prepare(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]],
                pad_decode_to: int | None = None) -> ForwardInputs:
        """Inputs for `decode` (one token each) then `prefill` (`chunk` tokens each, from
        the sequence's computed mark), laid out as attention_batch.py describes.
        `pad_decode_to` (a pure decode only) adds padding rows up to that many: token 0 at
        position 0, no slot, an empty context, which the kernels skip."""
        if self._copied is not None:
            self._copied.synchronize()
        if pad_decode_to is not None and (prefill or pad_decode_to < len(decode)):
            raise ValueError(f"only a pure decode of at most {pad_decode_to} rows is padded")
        block_size = self.block_size
        num_tokens = len(decode) + sum(chunk for _, chunk in prefill)
        decode_width = max((len(seq.block_table) for seq in decode), default=0)
        prefill_width = max((len(seq.block_table) for seq, _ in prefill), default=0)
        self._reserve(max(num_tokens, pad_decode_to or 0),
                      max(len(decode) + len(prefill), pad_decode_to or 0),
                      max(decode_width, prefill_width))
        token_ids, positions, slots = [], [], []
        # Decode rows: the bulk of a steady iteration, so without the general loop's ranges.
        for seq in decode:
            position = seq.num_computed
            token_ids.append(seq.token_ids[position])
            positions.append(position)
            slots.append(seq.block_table[position // block_size] * block_size
                         + position % block_size)
        decode_rows = [self._row(seq) for seq in decode]
        context_lens = [position + 1 for position in positions]

        sampled = list(decode)
        sample_rows: list[int] | None = None
        query_start, seq_lens = [0], []
        prompt_spans: list[PromptSpan] = []
        for seq, chunk in prefill:
            start = seq.num_computed
            scored = span_of(seq, start, chunk, len(token_ids))
            if scored is not None:
                prompt_spans.append(scored)
            token_ids += seq.token_ids[start:start + chunk]
            span = range(start, start + chunk)
            positions += span
            if start >= seq.rescore_below:
                slots += [seq.slot(position, block_size) for position in span]
            else:   # cached K/V read again to score the prompt: not stored twice
                slots += [seq.slot(position, block_size) if position >= seq.rescore_below
                          else -1 for position in span]
            query_start.append(query_start[-1] + chunk)
            seq_lens.append(start + chunk)
            if start + chunk == len(seq.token_ids):
                if sample_rows is None:
                    sample_rows = list(range(len(decode)))
                sampled.append(seq)
                sample_rows.append(len(token_ids) - 1)
        prefill_rows = [self._row(seq) for seq, _ in prefill]

        n = len(decode)
        if pad_decode_to is not None and pad_decode_to > n:
            padding = pad_decode_to - n
            token_ids += [0] * padding
            positions += [0] * padding
            slots += [-1] * padding
            context_lens += [0] * padding
            num_tokens = n = pad_decode_to
        self._token_ids.host.numpy()[:num_tokens] = token_ids
        self._positions.host.numpy()[:num_tokens] = positions
        self._slots.host.numpy()[:num_tokens] = slots
        self._context_lens.host.numpy()[:n] = context_lens
        self._seq_lens.host.numpy()[:len(seq_lens)] = seq_lens
        self._query_start.host.numpy()[:len(query_start)] = query_start
        batch = AttentionBatch(
            slot_mapping=self._slots.upload(num_tokens),
            num_decode_tokens=n,
            # Padding rows have no table: their empty context never reads it.
            decode_block_tables=self._gather_tables(self._decode_tables, decode_rows,
                                                    decode_width, 0),
            decode_context_lens=self._context_lens.upload(n),
            max_decode_context=max(context_lens, default=0),
            prefill_block_tables=self._gather_tables(self._prefill_tables, prefill_rows,
                                                     prefill_width, len(decode)),
            prefill_query_start=self._query_start.upload(len(query_start)),
            prefill_seq_lens=self._seq_lens.upload(len(seq_lens)),
            max_prefill_query=max((chunk for _, chunk in prefill), default=0),
            max_prefill_seq=max(seq_lens, default=0),
        )
        rows = None
        if sample_rows is not None:
            self._sample_rows.host.numpy()[:len(sample_rows)] = sample_rows
            rows = self._sample_rows.upload(len(sample_rows))
        inputs = ForwardInputs(self._token_ids.upload(num_tokens),
                               self._positions.upload(num_tokens), batch, sampled, rows,
                               prompt_spans)
        if self._mirrored:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return inputs

    def graph_inputs(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """(token_ids, positions, batch) of a pure decode of `num_rows` rows as views of the
        device buffers, block tables at their full width: what a CUDA graph is captured on.
        The contents are whatever the buffers hold; the capture fills them with padding."""
        self._reserve(num_rows, num_rows, 0)
        self._token_ids.host[:num_rows] = 0
        self._positions.host[:num_rows] = 0
        self._slots.host[:num_rows] = -1
        self._context_lens.host[:num_rows] = 0
        empty = self._query_start.upload(0)
        batch = AttentionBatch(
            slot_mapping=self._slots.upload(num_rows), num_decode_tokens=num_rows,
            decode_block_tables=self._decode_tables.device[:num_rows],
            decode_context_lens=self._context_lens.upload(num_rows), max_decode_context=0,
            prefill_block_tables=self._prefill_tables.device[:0],
            prefill_query_start=empty, prefill_seq_lens=empty,
            max_prefill_query=0, max_prefill_seq=0)
        return self._token_ids.upload(num_rows), self._positions.upload(num_rows), batch
