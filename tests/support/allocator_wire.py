"""The allocator's gRPC API as tests use it against a real allocator: an executor's side of the
protocol, op builders, and calls that read the server's state (sequences, pool statistics, used
blocks). The servers are fixtures in tests/conftest.py.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess

TOKEN = "integration-test-token"
ALLOCATOR = "pagedserve.allocator.v1.Allocator"
ADMIN = "pagedserve.allocator.v1.AllocatorAdmin"
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
Code = grpc.StatusCode


# -- an executor's side of the protocol -----------------------------------------------------------

@dataclass
class Executor:
    """A registered executor: sends Steps with increasing step ids at its epoch."""
    stub: pb_grpc.AllocatorStub
    executor_id: str
    epoch: int
    step_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # Where its registration said the Step channel listens (0: none).
    step_channel_port: int = 0

    def step(self, *ops: pb.BlockOp) -> pb.StepResponse:
        return self.stub.Step(self.request(next(self.step_ids), *ops), timeout=5)

    def request(self, step_id: int, *ops: pb.BlockOp) -> pb.StepRequest:
        return pb.StepRequest(executor_id=self.executor_id, epoch=self.epoch, step_id=step_id,
                              ops=ops)

    def heartbeat(self, num_waiting: int = 0, num_running: int = 0) -> pb.HeartbeatResponse:
        return self.stub.Heartbeat(pb.HeartbeatRequest(
            executor_id=self.executor_id, epoch=self.epoch, num_waiting=num_waiting,
            num_running=num_running), timeout=5)


def register(stub: pb_grpc.AllocatorStub, executor_id: str, num_blocks: int = 8,
             block_size: int = 4, address: str = "127.0.0.1:50053",
             model_fingerprint: str = "test-model", executor_index: int | None = None
             ) -> Executor:
    response = stub.RegisterExecutor(pb.RegisterExecutorRequest(
        executor_id=executor_id, address=address, num_blocks=num_blocks, block_size=block_size,
        model_fingerprint=model_fingerprint, executor_index=executor_index), timeout=5)
    return Executor(stub, executor_id, response.epoch,
                    step_channel_port=response.step_channel_port)


def allocate(seq_id: str, token_ids: Sequence[int], cache_salt: str = "",
             lookahead_slots: int = 0) -> pb.BlockOp:
    return pb.BlockOp(allocate=pb.AllocateOp(seq_id=seq_id, token_ids=token_ids,
                                             cache_salt=cache_salt,
                                             lookahead_slots=lookahead_slots))


def append(seq_id: str, token_ids: Sequence[int] = (), num_computed_tokens: int = 0,
           lookahead_slots: int = 0) -> pb.BlockOp:
    return pb.BlockOp(append=pb.AppendOp(seq_id=seq_id, token_ids=token_ids,
                                         num_computed_tokens=num_computed_tokens,
                                         lookahead_slots=lookahead_slots))


def fork(parent_seq_id: str, child_seq_id: str) -> pb.BlockOp:
    return pb.BlockOp(fork=pb.ForkOp(parent_seq_id=parent_seq_id, child_seq_id=child_seq_id))


def free(seq_id: str) -> pb.BlockOp:
    return pb.BlockOp(free=pb.FreeOp(seq_id=seq_id))


# -- assertions -----------------------------------------------------------------------------------

def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def health_status(channel: grpc.Channel, service: str) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5).status


def reflection_info(channel: grpc.Channel, service: str = REFLECTION):
    """ServerReflectionInfo of reflection `service` (either version: their messages are the
    same on the wire, so v1alpha's classes read v1's answers too)."""
    return channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)


def reflection_services(channel: grpc.Channel, service: str = REFLECTION) -> set[str]:
    responses = reflection_info(channel, service)(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    (response,) = list(responses)
    return {service.name for service in response.list_services_response.service}


def assert_health_and_reflection_answer(channel: grpc.Channel) -> None:
    for service in ("", ALLOCATOR, ADMIN):
        assert health_status(channel, service) == health_pb2.HealthCheckResponse.SERVING, service
    for version in (REFLECTION, REFLECTION_V1):
        assert reflection_services(channel, version) == {ALLOCATOR, ADMIN, HEALTH, REFLECTION,
                                                         REFLECTION_V1}


def seq_ids(admin: pb_grpc.AllocatorAdminStub, executor_id: str) -> list[str]:
    return [s.seq_id for s in admin.ListSequences(
        pb.ListSequencesRequest(executor_id=executor_id), timeout=5).sequences]


def pool_stats(admin: pb_grpc.AllocatorAdminStub, executor_id: str) -> pb.PoolStats:
    (stats,) = admin.GetStats(pb.GetStatsRequest(executor_id=executor_id), timeout=5).pools
    return stats


def used_blocks(allocator: AllocatorProcess, token: str = "") -> int:
    stats = pb_grpc.AllocatorAdminStub(allocator.channel(token)).GetStats(pb.GetStatsRequest())
    return stats.total.num_used_blocks
