"""The Allocator gRPC service: converts proto <-> domain and calls the core through its state
gate, journaling every change before the reply goes out."""
from __future__ import annotations

import grpc

from allocator_service.durability import commands
from allocator_service.durability.state import AllocatorState
from allocator_service.server import convert
from allocator_service.server.heap import freeze_long_lived
from allocator_service.server.step_handler import handle_step
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.block_codec import step_result_to_proto


class AllocatorServicer(pb_grpc.AllocatorServicer):
    def __init__(self, state: AllocatorState, step_channel_port: int = 0) -> None:
        """`step_channel_port`: where the Step channel listens, told to every executor that
        registers or asks (0: no channel)."""
        self.state = state
        self.step_channel_port = step_channel_port

    def RegisterExecutor(self, request: pb.RegisterExecutorRequest,
                         context: grpc.ServicerContext) -> pb.RegisterExecutorResponse:
        args = (request.executor_id, request.address, request.num_blocks, request.block_size,
                request.model_fingerprint)
        index = commands.executor_index_of(request)
        pool = self.state.core.build_pool(*args, index)  # slow for big pools: outside the lock
        with self.state.writing() as core:
            executor = core.register_executor(*args, pool=pool, executor_index=index)
            self.state.commit(commands.register(request))
        freeze_long_lived()
        return pb.RegisterExecutorResponse(epoch=executor.epoch,
                                           lease_ttl_s=self.state.core.lease_ttl_s,
                                           step_channel_port=self.step_channel_port)

    def Heartbeat(self, request: pb.HeartbeatRequest,
                  context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        if request.num_waiting < 0 or request.num_running < 0:
            raise InvalidArgument("num_waiting and num_running must not be negative")
        # Leases and load figures are not journaled: a heartbeat works while Redis is away.
        with self.state.reading() as core:
            core.heartbeat(request.executor_id, request.epoch, request.num_waiting,
                           request.num_running)
        return pb.HeartbeatResponse(lease_ttl_s=self.state.core.lease_ttl_s,
                                    step_channel_port=self.step_channel_port)

    def Step(self, request: pb.StepRequest, context: grpc.ServicerContext) -> pb.StepResponse:
        return step_result_to_proto(handle_step(self.state, request))

    def MatchPrefix(self, request: pb.MatchPrefixRequest,
                    context: grpc.ServicerContext) -> pb.MatchPrefixResponse:
        token_ids = tuple(request.token_ids)
        with self.state.reading() as core:
            matches = core.match_prefix(token_ids, request.cache_salt)
        return pb.MatchPrefixResponse(
            executors=[convert.prefix_match_to_proto(match) for match in matches])
