"""The forward pass's inputs, kept in buffers that are allocated once and then written in place.

Block tables are the large input: a row per sequence, a column per block. Every running
sequence owns a row of a persistent table buffer. The row is written in full when the
sequence first runs, and afterwards only where the sequence's table changed: a new block
appends one entry, and a copy-on-write or a new table (admission after a preemption) rewrites
the row. An iteration's block tables are the rows of the sequences it runs, gathered by one
`index_select`. Before this, every iteration rebuilt every table from Python lists.

The per-token inputs (token ids, positions, slots) and the per-sequence ones (context lengths,
query starts) are written into preallocated buffers through numpy views. On a GPU each buffer
then crosses in one host-to-device copy from pinned memory. On the CPU the buffers are the
inputs and nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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
        self._pinned = device.type == "cuda"
        # Marks when the last iteration's copies out of the pinned buffers were done: they
        # run asynchronously, and the next iteration writes into the same buffers.
        self._copied: torch.cuda.Event | None = None
        self._rows: dict[Sequence, _Row] = {}
        self._tables = self._host((max_num_seqs, max_blocks_per_seq), torch.int32, fill=-1)
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))  # pop() takes the lowest
        self._allocate_token_buffers(max_num_tokens)
        self._allocate_seq_buffers(max_num_seqs)

    # -- buffers --------------------------------------------------------------------------------

    def _host(self, shape, dtype: torch.dtype, fill: int = 0) -> torch.Tensor:
        return torch.full(shape, fill, dtype=dtype, pin_memory=self._pinned)

    def _allocate_token_buffers(self, size: int) -> None:
        self._token_ids = self._host((size,), torch.int64)
        self._positions = self._host((size,), torch.int64)
        self._slots = self._host((size,), torch.int64)
        self._sample_rows = self._host((size,), torch.int64)

    def _allocate_seq_buffers(self, size: int) -> None:
        self._context_lens = self._host((size,), torch.int32)
        self._seq_lens = self._host((size,), torch.int32)
        self._query_start = self._host((size + 1,), torch.int32)
        self._row_index = self._host((size,), torch.int64)

    def _reserve(self, num_tokens: int, num_seqs: int) -> None:
        """The scheduler keeps within the sizes given; grow rather than fail if it did not."""
        if num_tokens > self._token_ids.shape[0]:
            self._allocate_token_buffers(max(num_tokens, 2 * self._token_ids.shape[0]))
        if num_seqs > self._context_lens.shape[0]:
            self._allocate_seq_buffers(max(num_seqs, 2 * self._context_lens.shape[0]))

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
            self._tables = torch.cat([self._tables, self._host(self._tables.shape, torch.int32,
                                                               fill=-1)])
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))
        return self._free_rows.pop()

    def _widen(self, width: int) -> None:
        wider = self._host((self._tables.shape[0], max(width, 2 * self._tables.shape[1])),
                           torch.int32, fill=-1)
        wider[:, :self._tables.shape[1]] = self._tables
        self._tables = wider

    def _gather_tables(self, rows: list[int], width: int, start: int) -> torch.Tensor:
        """The rows' tables, `width` blocks wide, as one [len(rows), width] tensor."""
        index = self._row_index[start:start + len(rows)]
        index.numpy()[:] = rows
        return self._tables[:, :width].index_select(0, index)

    # -- one iteration --------------------------------------------------------------------------

    def prepare(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]]
                ) -> ForwardInputs:
        """Inputs for `decode` (one token each) then `prefill` (`chunk` tokens each, from
        the sequence's computed mark), laid out as attention_batch.py describes."""
        if self._copied is not None:
            self._copied.synchronize()
        block_size = self.block_size
        num_tokens = len(decode) + sum(chunk for _, chunk in prefill)
        self._reserve(num_tokens, len(decode) + len(prefill))
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
        for seq, chunk in prefill:
            start = seq.num_computed
            token_ids += seq.token_ids[start:start + chunk]
            span = range(start, start + chunk)
            positions += span
            slots += [seq.slot(position, block_size) for position in span]
            query_start.append(query_start[-1] + chunk)
            seq_lens.append(start + chunk)
            if start + chunk == len(seq.token_ids):
                if sample_rows is None:
                    sample_rows = list(range(len(decode)))
                sampled.append(seq)
                sample_rows.append(len(token_ids) - 1)
        prefill_rows = [self._row(seq) for seq, _ in prefill]

        n = len(decode)
        self._token_ids.numpy()[:num_tokens] = token_ids
        self._positions.numpy()[:num_tokens] = positions
        self._slots.numpy()[:num_tokens] = slots
        self._context_lens.numpy()[:n] = context_lens
        self._seq_lens.numpy()[:len(seq_lens)] = seq_lens
        self._query_start.numpy()[:len(query_start)] = query_start
        decode_width = max((len(seq.block_table) for seq in decode), default=0)
        prefill_width = max((len(seq.block_table) for seq, _ in prefill), default=0)
        batch = AttentionBatch(
            slot_mapping=self._device(self._slots[:num_tokens]),
            num_decode_tokens=n,
            decode_block_tables=self._device(self._gather_tables(decode_rows, decode_width, 0)),
            decode_context_lens=self._device(self._context_lens[:n]),
            max_decode_context=max(context_lens, default=0),
            prefill_block_tables=self._device(
                self._gather_tables(prefill_rows, prefill_width, n)),
            prefill_query_start=self._device(self._query_start[:len(query_start)]),
            prefill_seq_lens=self._device(self._seq_lens[:len(seq_lens)]),
            max_prefill_query=max((chunk for _, chunk in prefill), default=0),
            max_prefill_seq=max(seq_lens, default=0),
        )
        rows = None
        if sample_rows is not None:
            self._sample_rows.numpy()[:len(sample_rows)] = sample_rows
            rows = self._device(self._sample_rows[:len(sample_rows)])
        inputs = ForwardInputs(self._device(self._token_ids[:num_tokens]),
                               self._device(self._positions[:num_tokens]), batch, sampled, rows)
        if self._pinned:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return inputs

    def _device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        return host.to(self.device, non_blocking=True)
