"""The AllocatorAdmin gRPC service: read-only views of the core, the prefix-cache reset, and
the KV event stream."""
from __future__ import annotations

from collections.abc import Iterator

import grpc

from allocator_service.core.audit import audit_pool
from allocator_service.core.inspection import block_views, pool_stats, total_stats
from allocator_service.durability import commands
from allocator_service.durability.state import AllocatorState
from allocator_service.server import convert
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.errors import InvalidArgument

# Events sent per read of the store, and how long a follower waits for new ones per read (the
# stream notices a cancelled caller at most this late).
EVENT_BATCH = 500
FOLLOW_POLL_S = 0.5


class AllocatorAdminServicer(pb_grpc.AllocatorAdminServicer):
    def __init__(self, state: AllocatorState) -> None:
        self.state = state

    def GetStats(self, request: pb.GetStatsRequest,
                 context: grpc.ServicerContext) -> pb.GetStatsResponse:
        with self.state.reading() as core:
            pools = [pool_stats(ex.executor_id, ex.pool)
                     for ex in core.sorted_executors(request.executor_id)]
            applied_seq = self.state.store.applied_seq
        return pb.GetStatsResponse(pools=[convert.pool_stats_to_proto(s) for s in pools],
                                   total=convert.pool_stats_to_proto(total_stats(pools)),
                                   state_store=self.state.store.description,
                                   applied_seq=applied_seq)

    def ListExecutors(self, request: pb.ListExecutorsRequest,
                      context: grpc.ServicerContext) -> pb.ListExecutorsResponse:
        with self.state.reading() as core:
            infos = [convert.executor_to_proto(ex, core.lease_remaining(ex))
                     for ex in core.sorted_executors()]
        return pb.ListExecutorsResponse(executors=infos)

    def ListSequences(self, request: pb.ListSequencesRequest,
                      context: grpc.ServicerContext) -> pb.ListSequencesResponse:
        with self.state.reading() as core:
            infos = [convert.sequence_to_proto(ex.executor_id, ex.pool.sequences[seq_id])
                     for ex in core.sorted_executors(request.executor_id)
                     for seq_id in sorted(ex.pool.sequences)]
        return pb.ListSequencesResponse(sequences=infos)

    def GetBlockTable(self, request: pb.GetBlockTableRequest,
                      context: grpc.ServicerContext) -> pb.GetBlockTableResponse:
        if not request.seq_id:
            raise InvalidArgument("seq_id is empty")
        with self.state.reading() as core:
            executor, seq_id = core.find_sequence(request.executor_id, request.seq_id)
            seq = executor.pool.sequences[seq_id]
            return pb.GetBlockTableResponse(
                executor_id=executor.executor_id, seq_id=seq_id, block_ids=seq.block_ids(),
                num_tokens=seq.num_tokens, block_size=executor.pool.block_size)

    def DumpBlocks(self, request: pb.DumpBlocksRequest,
                   context: grpc.ServicerContext) -> pb.DumpBlocksResponse:
        if not request.executor_id:
            raise InvalidArgument("executor_id is empty; DumpBlocks shows one pool")
        with self.state.reading() as core:
            (executor,) = core.sorted_executors(request.executor_id)
            views = block_views(executor.pool)
            free_list = executor.pool.blocks.free_block_ids()
        return pb.DumpBlocksResponse(
            executor_id=executor.executor_id, block_size=executor.pool.block_size,
            blocks=[convert.block_to_proto(view) for view in views], free_list=free_list)

    def Audit(self, request: pb.AuditRequest, context: grpc.ServicerContext) -> pb.AuditResponse:
        with self.state.reading() as core:
            executor_ids = [ex.executor_id for ex in core.sorted_executors()]
        violations: list[str] = []
        num_pools = num_blocks = 0
        for executor_id in executor_ids:
            # One pool per hold of the lock: every invariant is a pool's own, and Steps then
            # wait for one pool's audit (tens of ms), not for a fleet's (seconds).
            with self.state.reading() as core:
                executor = core.executors.get(executor_id)
                if executor is None:   # gone meanwhile (its lease lapsed)
                    continue
                violations += audit_pool(executor_id, executor.pool)
                num_pools += 1
                num_blocks += executor.pool.num_blocks
        return pb.AuditResponse(violations=violations, num_pools=num_pools,
                                num_blocks=num_blocks)

    def ResetPrefixCache(self, request: pb.ResetPrefixCacheRequest,
                         context: grpc.ServicerContext) -> pb.ResetPrefixCacheResponse:
        with self.state.writing() as core:
            dropped = core.reset_prefix_cache(request.executor_id)
            self.state.commit(commands.reset(request))
        return pb.ResetPrefixCacheResponse(num_entries_dropped=dropped)

    def StreamEvents(self, request: pb.StreamEventsRequest,
                     context: grpc.ServicerContext) -> Iterator[pb.KvEvent]:
        if request.from_seq < 0:
            raise InvalidArgument(f"from_seq must not be negative, got {request.from_seq}")
        next_seq = max(1, request.from_seq)
        while context.is_active():
            wait_s = FOLLOW_POLL_S if request.follow else 0.0
            events = self.state.store.read_events(next_seq, EVENT_BATCH, wait_s)
            for event in events:
                yield convert.event_to_proto(event)
            if events:
                next_seq = events[-1].seq + 1
            elif not request.follow:
                return
