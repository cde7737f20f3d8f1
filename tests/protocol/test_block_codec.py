"""The block protocol's codec (pagedserve.protocol.block_codec) keeps every field, both ways."""
from __future__ import annotations

from array import array

import pytest

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_codec import (op_to_proto, ops_from_proto, step_result_from_proto,
                                             step_result_to_proto)
from pagedserve.protocol.block_ops import (AllocateOp, AppendOp, ForkOp, FreeOp, InvalidOp,
                                           OpResult, OpStatus, StepResult)


def test_every_op_kind_round_trips_through_its_proto() -> None:
    ops = [AllocateOp("a", (1, 2, 3), "tenant", 5), AppendOp("a", (4,), 2, 3),
           AppendOp("a"), ForkOp("a", "b"), FreeOp("a")]
    # The encoder packs token ids; the decoder hands them over as int32 arrays.
    assert ops_from_proto([op_to_proto(op) for op in ops]) == [
        AllocateOp("a", array("i", [1, 2, 3]), "tenant", 5), AppendOp("a", array("i", [4]), 2, 3),
        AppendOp("a", []), ForkOp("a", "b"), FreeOp("a")]


def test_packed_and_repeated_token_ids_decode_to_the_same_ids() -> None:
    ids = [0, 7, 70000, 2**31 - 1]
    packed = b"".join(i.to_bytes(4, "little") for i in ids)  # as the proto comment says
    assert op_to_proto(AppendOp("a", tuple(ids))).append.packed_token_ids == packed
    repeated = [pb.BlockOp(append=pb.AppendOp(seq_id="a", token_ids=ids)),
                pb.BlockOp(allocate=pb.AllocateOp(seq_id="b", token_ids=ids))]
    packed_ops = [pb.BlockOp(append=pb.AppendOp(seq_id="a", packed_token_ids=packed)),
                  pb.BlockOp(allocate=pb.AllocateOp(seq_id="b", packed_token_ids=packed))]
    assert [list(op.token_ids) for op in ops_from_proto(repeated)] == [ids, ids]
    assert [list(op.token_ids) for op in ops_from_proto(packed_ops)] == [ids, ids]


@pytest.mark.parametrize("op, error", [
    (pb.AppendOp(seq_id="a", packed_token_ids=b"\1\0\0"), "packed_token_ids is 3 bytes"),
    (pb.AppendOp(seq_id="a", token_ids=[1], packed_token_ids=b"\1\0\0\0"), "sets both"),
])
def test_malformed_packed_token_ids_are_refused_with_the_ops_index(op, error) -> None:
    with pytest.raises(InvalidOp, match=rf"ops\[1\].*{error}"):
        ops_from_proto([op_to_proto(FreeOp("x")), pb.BlockOp(append=op)])


def test_op_without_a_kind_is_refused_with_its_index() -> None:
    with pytest.raises(InvalidOp, match=r"ops\[1\] sets no kind"):
        ops_from_proto([op_to_proto(FreeOp("a")), pb.BlockOp()])


def test_step_response_carries_statuses_tables_and_copies() -> None:
    result = StepResult([
        OpResult(block_table=[3, 4], num_cached_tokens=16),
        OpResult(new_blocks=[7], copies=[(4, 8)]),
        OpResult(OpStatus.OUT_OF_BLOCKS, "out of blocks: 0 of 9 free"),
    ], num_free_blocks=0, replayed=True)
    response = step_result_to_proto(result)
    assert response == pb.StepResponse(
        results=[pb.OpResult(block_table=[3, 4], num_cached_tokens=16),
                 pb.OpResult(new_blocks=[7], copies=[pb.BlockCopy(src_block=4, dst_block=8)]),
                 pb.OpResult(status=pb.OP_STATUS_OUT_OF_BLOCKS,
                             message="out of blocks: 0 of 9 free")],
        replayed=True, num_free_blocks=0)
    assert step_result_from_proto(response) == result
