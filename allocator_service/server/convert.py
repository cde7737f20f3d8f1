"""proto <-> domain conversions of the allocator's own views (matches, stats, executors,
sequences, blocks, events). The Step's ops and results are the shared block protocol's:
pagedserve.protocol.block_codec."""
from __future__ import annotations

from allocator_service.core.allocator import PrefixMatch, RegisteredExecutor
from allocator_service.core.inspection import BlockView, PoolStats
from allocator_service.core.kv_events import KvEvent
from allocator_service.core.sequence import Sequence
from pagedserve.allocator.v1 import allocator_pb2 as pb


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
        last_step_id=executor.last_step_id, executor_index=executor.executor_index)


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
