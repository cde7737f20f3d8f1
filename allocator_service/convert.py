"""proto <-> domain conversions for the allocator; nothing else lives here."""
from __future__ import annotations

from collections.abc import Iterable

from allocator_service.allocator import PrefixMatch, RegisteredExecutor
from allocator_service.block import SeqId
from allocator_service.errors import InvalidOp
from allocator_service.inspection import BlockView, PoolStats
from allocator_service.kv_events import KvEvent
from allocator_service.ops import AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp, StepResult
from allocator_service.sequence import Sequence
from pagedserve.allocator.v1 import allocator_pb2 as pb


def ops_from_proto(ops: Iterable[pb.BlockOp]) -> list[BlockOp]:
    converted: list[BlockOp] = []
    for index, op in enumerate(ops):
        kind = op.WhichOneof("kind")
        if kind == "append":
            o = op.append
            converted.append(AppendOp(SeqId(o.seq_id), tuple(o.token_ids), o.lookahead_slots,
                                      o.num_computed_tokens))
        elif kind == "allocate":
            o = op.allocate
            converted.append(AllocateOp(SeqId(o.seq_id), tuple(o.token_ids), o.cache_salt,
                                        o.lookahead_slots))
        elif kind == "fork":
            converted.append(ForkOp(SeqId(op.fork.parent_seq_id), SeqId(op.fork.child_seq_id)))
        elif kind == "free":
            converted.append(FreeOp(SeqId(op.free.seq_id)))
        else:
            raise InvalidOp(f"ops[{index}] sets no kind: set one of allocate, append, fork, free")
    return converted


def op_to_proto(op: BlockOp) -> pb.BlockOp:
    """The proto an executor's client sends for a domain op (ops_from_proto's inverse)."""
    if isinstance(op, AppendOp):
        return pb.BlockOp(append=pb.AppendOp(
            seq_id=op.seq_id, token_ids=op.token_ids, lookahead_slots=op.lookahead_slots,
            num_computed_tokens=op.num_computed_tokens))
    if isinstance(op, AllocateOp):
        return pb.BlockOp(allocate=pb.AllocateOp(
            seq_id=op.seq_id, token_ids=op.token_ids, cache_salt=op.cache_salt,
            lookahead_slots=op.lookahead_slots))
    if isinstance(op, ForkOp):
        return pb.BlockOp(fork=pb.ForkOp(parent_seq_id=op.parent_seq_id,
                                         child_seq_id=op.child_seq_id))
    assert isinstance(op, FreeOp)
    return pb.BlockOp(free=pb.FreeOp(seq_id=op.seq_id))


def step_response(result: StepResult) -> pb.StepResponse:
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


def prefix_match_to_proto(match: PrefixMatch) -> pb.ExecutorMatch:
    return pb.ExecutorMatch(
        executor_id=match.executor_id, address=match.address,
        num_cached_tokens=match.num_cached_tokens, num_free_blocks=match.num_free_blocks,
        num_blocks=match.num_blocks, num_waiting=match.num_waiting,
        num_running=match.num_running, num_sequences=match.num_sequences)


def pool_stats_to_proto(stats: PoolStats) -> pb.PoolStats:
    histogram = stats.refcount_histogram or {}
    return pb.PoolStats(
        executor_id=stats.executor_id, num_blocks=stats.num_blocks,
        num_free_blocks=stats.num_free_blocks, num_cached_free_blocks=stats.num_cached_free_blocks,
        num_used_blocks=stats.num_used_blocks, usage_percent=stats.usage_percent,
        prefix_query_tokens=stats.prefix_query_tokens, prefix_hit_tokens=stats.prefix_hit_tokens,
        prefix_hit_rate=stats.prefix_hit_rate, tokens_stored=stats.tokens_stored,
        slots_allocated=stats.slots_allocated,
        refcount_histogram=[pb.RefcountBucket(ref_count=count, num_blocks=histogram[count])
                            for count in sorted(histogram)],
        num_sequences=stats.num_sequences, block_size=stats.block_size)


def executor_to_proto(executor: RegisteredExecutor, lease_remaining_s: float) -> pb.ExecutorInfo:
    return pb.ExecutorInfo(
        executor_id=executor.executor_id, address=executor.address, epoch=executor.epoch,
        num_blocks=executor.pool.num_blocks, block_size=executor.pool.block_size,
        model_fingerprint=executor.model_fingerprint, lease_remaining_s=lease_remaining_s,
        num_waiting=executor.num_waiting, num_running=executor.num_running,
        last_step_id=executor.last_step_id)


def sequence_to_proto(executor_id: str, seq: Sequence) -> pb.SequenceInfo:
    return pb.SequenceInfo(
        executor_id=executor_id, seq_id=seq.seq_id, num_tokens=seq.num_tokens,
        num_blocks=len(seq.block_table), num_cached_tokens=seq.num_cached_tokens,
        num_computed_tokens=seq.num_computed_tokens)


def block_to_proto(view: BlockView) -> pb.BlockInfo:
    return pb.BlockInfo(block_id=view.block_id, state=view.state.value,  # type: ignore[arg-type]
                        ref_count=view.ref_count, block_hash=view.block_hash,
                        num_tokens=view.num_tokens, parent_block_hash=view.parent_hash)


def event_to_proto(event: KvEvent) -> pb.KvEvent:
    return pb.KvEvent(seq=event.seq, type=event.type.value,  # type: ignore[arg-type]
                      executor_id=event.executor_id, block_id=event.block_id,
                      block_hash=event.block_hash, parent_block_hash=event.parent_hash,
                      token_ids=event.token_ids, reason=event.reason,
                      num_blocks=event.num_blocks, block_size=event.block_size)
