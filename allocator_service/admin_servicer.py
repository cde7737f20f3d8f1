"""The AllocatorAdmin gRPC service: read-only views of the core, plus the prefix-cache reset."""
from __future__ import annotations

import threading

import grpc

from allocator_service import convert
from allocator_service.allocator import Allocator
from allocator_service.audit import audit_pool
from allocator_service.inspection import block_views, pool_stats, total_stats
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.errors import InvalidArgument


class AllocatorAdminServicer(pb_grpc.AllocatorAdminServicer):
    def __init__(self, core: Allocator, lock: threading.Lock) -> None:
        self.core = core
        self.lock = lock

    def GetStats(self, request: pb.GetStatsRequest,
                 context: grpc.ServicerContext) -> pb.GetStatsResponse:
        with self.lock:
            pools = [pool_stats(ex.executor_id, ex.pool)
                     for ex in self.core.sorted_executors(request.executor_id)]
        return pb.GetStatsResponse(pools=[convert.pool_stats_to_proto(s) for s in pools],
                                   total=convert.pool_stats_to_proto(total_stats(pools)))

    def ListExecutors(self, request: pb.ListExecutorsRequest,
                      context: grpc.ServicerContext) -> pb.ListExecutorsResponse:
        with self.lock:
            infos = [convert.executor_to_proto(ex, self.core.lease_remaining(ex))
                     for ex in self.core.sorted_executors()]
        return pb.ListExecutorsResponse(executors=infos)

    def ListSequences(self, request: pb.ListSequencesRequest,
                      context: grpc.ServicerContext) -> pb.ListSequencesResponse:
        with self.lock:
            infos = [convert.sequence_to_proto(ex.executor_id, ex.pool.sequences[seq_id])
                     for ex in self.core.sorted_executors(request.executor_id)
                     for seq_id in sorted(ex.pool.sequences)]
        return pb.ListSequencesResponse(sequences=infos)

    def GetBlockTable(self, request: pb.GetBlockTableRequest,
                      context: grpc.ServicerContext) -> pb.GetBlockTableResponse:
        if not request.seq_id:
            raise InvalidArgument("seq_id is empty")
        with self.lock:
            executor, seq_id = self.core.find_sequence(request.executor_id, request.seq_id)
            seq = executor.pool.sequences[seq_id]
            return pb.GetBlockTableResponse(
                executor_id=executor.executor_id, seq_id=seq_id, block_ids=seq.block_ids(),
                num_tokens=seq.num_tokens, block_size=executor.pool.block_size)

    def DumpBlocks(self, request: pb.DumpBlocksRequest,
                   context: grpc.ServicerContext) -> pb.DumpBlocksResponse:
        if not request.executor_id:
            raise InvalidArgument("executor_id is empty; DumpBlocks shows one pool")
        with self.lock:
            (executor,) = self.core.sorted_executors(request.executor_id)
            views = block_views(executor.pool)
            free_list = [block.block_id for block in executor.pool.blocks.free_list()]
        return pb.DumpBlocksResponse(
            executor_id=executor.executor_id, block_size=executor.pool.block_size,
            blocks=[convert.block_to_proto(view) for view in views], free_list=free_list)

    def Audit(self, request: pb.AuditRequest, context: grpc.ServicerContext) -> pb.AuditResponse:
        with self.lock:
            executors = self.core.sorted_executors()
            violations = [v for ex in executors for v in audit_pool(ex.executor_id, ex.pool)]
            num_blocks = sum(ex.pool.num_blocks for ex in executors)
        return pb.AuditResponse(violations=violations, num_pools=len(executors),
                                num_blocks=num_blocks)

    def ResetPrefixCache(self, request: pb.ResetPrefixCacheRequest,
                         context: grpc.ServicerContext) -> pb.ResetPrefixCacheResponse:
        with self.lock:
            dropped = self.core.reset_prefix_cache(request.executor_id)
        return pb.ResetPrefixCacheResponse(num_entries_dropped=dropped)
