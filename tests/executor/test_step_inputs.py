"""The forward pass's persistent inputs (executor_service/engine/step_inputs.py): the layout the
kernels read, a block-table buffer written only where a sequence's table changed, and pure decodes
padded to a CUDA graph's batch size."""
from __future__ import annotations

import pytest
import torch

from executor_service.engine.request import Request, Sequence, SequenceStatus
from executor_service.engine.step_inputs import StepInputs
from pagedserve.protocol.sampling_params import SamplingParams

BLOCK = 4


def running(name: str, tokens: int, computed: int, table: list[int]) -> Sequence:
    request = Request(name, list(range(tokens)), SamplingParams())
    seq = Sequence(f"{name}#0", request, 0, [100 + t for t in range(tokens)], tokens,
                   status=SequenceStatus.RUNNING, block_table=list(table),
                   num_computed=computed)
    request.sequences.append(seq)
    return seq


def inputs(max_num_seqs: int = 4, max_num_tokens: int = 16) -> StepInputs:
    return StepInputs(max_num_seqs, max_num_tokens, 8, BLOCK, torch.device("cpu"))


def test_decode_rows_then_prefill_chunks_in_the_kernels_layout():
    a = running("a", 6, 5, [7, 3])          # decodes token 5 (block 3, offset 1)
    b = running("b", 9, 8, [1, 2, 9])       # decodes token 8 (block 9, offset 0)
    c = running("c", 7, 2, [4, 5])          # prefills tokens 2..6 in full: sampled
    d = running("d", 10, 0, [6, 8, 10])     # prefills 0..2 of 10: not sampled yet
    step = inputs().prepare([a, b], [(c, 5), (d, 3)])

    assert step.token_ids.tolist() == [105, 108, 102, 103, 104, 105, 106, 100, 101, 102]
    assert step.positions.tolist() == [5, 8, 2, 3, 4, 5, 6, 0, 1, 2]
    expected_slots = [a.slot(5, BLOCK), b.slot(8, BLOCK)] + \
        [c.slot(p, BLOCK) for p in range(2, 7)] + [d.slot(p, BLOCK) for p in range(3)]
    batch = step.batch
    assert batch.slot_mapping.tolist() == expected_slots
    assert batch.num_decode_tokens == 2
    assert batch.decode_block_tables.tolist() == [[7, 3, -1], [1, 2, 9]]
    assert batch.decode_context_lens.tolist() == [6, 9]
    assert batch.max_decode_context == 9
    assert batch.prefill_block_tables.tolist() == [[4, 5, -1], [6, 8, 10]]
    assert batch.prefill_query_start.tolist() == [0, 5, 8]
    assert batch.prefill_seq_lens.tolist() == [7, 3]
    assert (batch.max_prefill_query, batch.max_prefill_seq) == (5, 7)
    assert step.sampled == [a, b, c]
    assert step.sample_rows.tolist() == [0, 1, 6]


def test_a_pure_decode_samples_its_first_rows_without_an_index():
    a, b = running("a", 6, 5, [7, 3]), running("b", 3, 2, [1])
    step = inputs().prepare([a, b], [])
    assert step.sampled == [a, b] and step.sample_rows is None


def test_the_table_buffer_is_written_only_where_a_table_changed():
    seq = running("a", 6, 5, [7, 3])
    buffers = inputs()
    buffers.prepare([seq], [])
    # Poison an entry the next iterations have no reason to write: a rebuild would undo it.
    buffers._tables[buffers._row(seq), 0] = 99

    seq.block_table.append(11)              # a new block: only its entry is written
    seq.token_ids += [106, 107, 108]
    seq.num_computed = 8
    assert buffers.prepare([seq], []).batch.decode_block_tables.tolist() == [[99, 3, 11]]

    seq.replace_block(3, 12)                # copy-on-write: the row is written again
    assert buffers.prepare([seq], []).batch.decode_block_tables.tolist() == [[7, 12, 11]]

    buffers._tables[buffers._row(seq), 0] = 99
    seq.block_table = [20, 21, 22]          # a new table (readmitted): written again
    assert buffers.prepare([seq], []).batch.decode_block_tables.tolist() == [[20, 21, 22]]


def test_rows_of_sequences_that_stopped_running_are_reused_and_the_buffers_grow():
    buffers = inputs(max_num_seqs=2, max_num_tokens=2)
    first = [running("s0", 3, 2, [0, 7, 8]), running("s1", 3, 2, [1, 2])]
    buffers.prepare(first, [])
    first[0].status = SequenceStatus.FINISHED
    newcomer = running("new", 3, 2, [5])
    step = buffers.prepare([first[1], newcomer], [])
    # The finished sequence's row, its old blocks gone: padding reads -1.
    assert step.batch.decode_block_tables.tolist() == [[1, 2], [5, -1]]
    assert buffers._rows[newcomer].index == 0

    # More running sequences and tokens than the sizes given: the buffers grow.
    crowd = [running(f"c{i}", 3, 2, [10 + i]) for i in range(5)]
    step = buffers.prepare(crowd, [(running("p", 6, 0, [30, 31]), 6)])
    assert step.batch.decode_block_tables.tolist() == [[10 + i] for i in range(5)]
    assert step.batch.prefill_block_tables.tolist() == [[30, 31]]
    assert step.token_ids.tolist() == [102] * 5 + [100, 101, 102, 103, 104, 105]


def test_a_table_longer_than_the_buffer_widens_it():
    buffers = inputs()
    short, long = running("short", 3, 2, [1]), running("long", 3, 2, list(range(40, 52)))
    step = buffers.prepare([short, long], [])
    assert step.batch.decode_block_tables.tolist() == [[1] + [-1] * 11, list(range(40, 52))]


def test_a_padded_decode_adds_rows_the_kernels_skip():
    buffers = inputs(max_num_seqs=8)
    a, b = running("a", 6, 5, [7, 3]), running("b", 9, 8, [1, 2, 9])
    step = buffers.prepare([a, b], [], pad_decode_to=4)
    assert step.token_ids.tolist() == [105, 108, 0, 0]
    assert step.positions.tolist() == [5, 8, 0, 0]
    batch = step.batch
    assert batch.num_decode_tokens == 4
    assert batch.slot_mapping.tolist() == [a.slot(5, BLOCK), b.slot(8, BLOCK), -1, -1]
    assert batch.decode_context_lens.tolist() == [6, 9, 0, 0]
    # Padding rows have no table (an empty context reads none); only real rows are sampled.
    assert batch.decode_block_tables.tolist() == [[7, 3, -1], [1, 2, 9]]
    assert step.sampled == [a, b] and step.sample_rows is None


def test_only_a_pure_decode_that_fits_is_padded():
    buffers = inputs(max_num_seqs=8)
    a, b = running("a", 6, 5, [7, 3]), running("b", 9, 8, [1, 2, 9])
    with pytest.raises(ValueError, match="only a pure decode of at most 1 rows"):
        buffers.prepare([a, b], [], pad_decode_to=1)
    with pytest.raises(ValueError, match="only a pure decode"):
        buffers.prepare([a], [(b, 1)], pad_decode_to=4)


def test_buffers_grown_in_inference_mode_take_writes_outside_it():
    # A CUDA-graph capture (under inference mode) reserves rows for its largest batch; with
    # --max-num-batched-tokens below --max-num-seqs that grows the token buffers. Tensors made
    # in inference mode refuse in-place writes outside it: the first step then failed on a GPU
    # (where upload() copies into the device side; here both sides are one tensor, so the test
    # checks what the step hands out).
    step_inputs = inputs(max_num_seqs=8, max_num_tokens=2)
    with torch.inference_mode():
        step_inputs.graph_inputs(8)
    a, b, c = running("a", 6, 5, [7, 3]), running("b", 9, 8, [1, 2, 9]), running("c", 4, 3, [5])
    step = step_inputs.prepare([a, b, c], [])
    handed_out = [step.token_ids, step.positions, step.batch.slot_mapping,
                  step.batch.decode_block_tables, step.batch.decode_context_lens]
    assert not any(tensor.is_inference() for tensor in handed_out)
    assert step.token_ids.tolist() == [105, 108, 103]
    assert step.batch.decode_block_tables.tolist() == [[7, 3, -1], [1, 2, 9], [5, -1, -1]]
