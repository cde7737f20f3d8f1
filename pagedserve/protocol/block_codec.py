"""The block protocol on the wire: Step ops and their results, proto <-> domain, both directions.

The executor's allocator client encodes ops and decodes results; the allocator's servicer (and
its journal) decode ops and encode results. One module, so the two sides cannot drift.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_ops import (AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp, InvalidOp,
                                           OpResult, OpStatus, StepResult)
from pagedserve.protocol.token_bytes import TOKEN_BYTES, bytes_to_array, ids_to_bytes


def _token_ids(op: pb.AllocateOp | pb.AppendOp, index: int) -> Sequence[int]:
    """The ids of ops[index]: packed ones become an int32 array in one copy; the repeated field
    costs an int object per token, and its slice is the cheapest way to read it (a list, kept
    as it is)."""
    packed = op.packed_token_ids
    if not packed:
        return op.token_ids[:]
    if len(packed) % TOKEN_BYTES:
        raise InvalidOp(f"ops[{index}]: packed_token_ids is {len(packed)} bytes, not a "
                        f"multiple of {TOKEN_BYTES}")
    if len(op.token_ids):
        raise InvalidOp(f"ops[{index}] sets both token_ids and packed_token_ids; set one")
    return bytes_to_array(packed)


def op_to_proto(op: BlockOp) -> pb.BlockOp:
    if isinstance(op, AppendOp):
        return pb.BlockOp(append=pb.AppendOp(
            seq_id=op.seq_id, packed_token_ids=ids_to_bytes(op.token_ids),
            lookahead_slots=op.lookahead_slots, num_computed_tokens=op.num_computed_tokens))
    if isinstance(op, AllocateOp):
        return pb.BlockOp(allocate=pb.AllocateOp(
            seq_id=op.seq_id, packed_token_ids=ids_to_bytes(op.token_ids),
            cache_salt=op.cache_salt, lookahead_slots=op.lookahead_slots))
    if isinstance(op, ForkOp):
        return pb.BlockOp(fork=pb.ForkOp(parent_seq_id=op.parent_seq_id,
                                         child_seq_id=op.child_seq_id))
    assert isinstance(op, FreeOp)
    return pb.BlockOp(free=pb.FreeOp(seq_id=op.seq_id))


def ops_from_proto(ops: Iterable[pb.BlockOp]) -> list[BlockOp]:
    converted: list[BlockOp] = []
    add = converted.append
    for index, op in enumerate(ops):
        # Appends first: nearly every op of a Step is one. HasField is cheaper than WhichOneof.
        # Ids go in as the strings they are: SeqId() is a call per op that does nothing.
        if op.HasField("append"):
            o = op.append
            add(AppendOp(o.seq_id, _token_ids(o, index),  # type: ignore[arg-type]
                         o.lookahead_slots, o.num_computed_tokens))
        elif op.HasField("allocate"):
            o = op.allocate
            add(AllocateOp(o.seq_id, _token_ids(o, index),  # type: ignore[arg-type]
                           o.cache_salt, o.lookahead_slots))
        elif op.HasField("fork"):
            add(ForkOp(op.fork.parent_seq_id, op.fork.child_seq_id))  # type: ignore[arg-type]
        elif op.HasField("free"):
            add(FreeOp(op.free.seq_id))  # type: ignore[arg-type]
        else:
            raise InvalidOp(
                f"ops[{index}] sets no kind: set one of allocate, append, fork, free")
    return converted


def step_result_to_proto(result: StepResult) -> pb.StepResponse:
    response = pb.StepResponse(replayed=result.replayed, num_free_blocks=result.num_free_blocks)
    for op_result in result.results:
        out = response.results.add()
        # Only non-default fields are set: most results of a decode step are empty OKs.
        if op_result.status:
            out.status = op_result.status.value  # type: ignore[assignment]
            out.message = op_result.message
        if op_result.block_table:
            out.block_table.extend(op_result.block_table)
        if op_result.num_cached_tokens:
            out.num_cached_tokens = op_result.num_cached_tokens
        if op_result.new_blocks:
            out.new_blocks.extend(op_result.new_blocks)
        for src, dst in op_result.copies:
            out.copies.add(src_block=src, dst_block=dst)
    return response


def step_result_from_proto(response: pb.StepResponse) -> StepResult:
    results = [OpResult(OpStatus(r.status), r.message, list(r.block_table), r.num_cached_tokens,
                        list(r.new_blocks), [(c.src_block, c.dst_block) for c in r.copies])
               for r in response.results]
    return StepResult(results, response.num_free_blocks, response.replayed)
