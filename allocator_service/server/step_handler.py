"""The Step itself, for both of its transports: the Step RPC (allocator_servicer.py) and the
Step channel (step_channel.py) call this one function, so the two cannot answer differently."""
from __future__ import annotations

from allocator_service.durability import commands
from allocator_service.durability.state import AllocatorState
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_codec import ops_from_proto, step_result_to_proto


def handle_step(state: AllocatorState, request: pb.StepRequest) -> pb.StepResponse:
    """Applies the step through the state gate and journals it before answering; a retried
    step id answers its recorded response and journals nothing. Raises the domain errors the
    callers map to status codes."""
    ops = ops_from_proto(request.ops)
    # A retry is the same request byte for byte; a replay carrying other ops is caught. The
    # digest is of the deterministic serialization, so it does not depend on the transport.
    body = request.SerializeToString(deterministic=True)
    with state.writing() as core:
        result = core.step(request.executor_id, request.epoch, request.step_id, ops,
                           commands.step_digest(body))
        if not result.replayed:
            state.commit(commands.step(body))
    return step_result_to_proto(result)
