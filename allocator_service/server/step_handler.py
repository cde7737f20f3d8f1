"""The Step itself, for both of its transports: the Step RPC (allocator_servicer.py) and the
Step channel (step_channel.py) call this one module, so the two cannot answer differently.

The channel hands over every Step that arrived in one turn of its event loop. They apply one
after another under one hold of the state lock and are journaled in one commit, before any of
their replies goes out (a group commit): with Redis, one round trip for all of them. The more
executors send at once, the more each round trip carries, so a busy allocator waits on Redis
less per Step. Each Step still succeeds or fails alone; only a failed commit fails them all.
"""
from __future__ import annotations

from allocator_service.durability import commands
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import Change
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.errors import PagedServeError
from pagedserve.protocol.block_codec import ops_from_proto, step_result_to_proto
from pagedserve.protocol.block_ops import BlockOp, StepResult

# What a Step comes to: its answer, or why it has none. A PagedServeError is the caller's (an
# UNAVAILABLE store, a stale epoch, a malformed op); any other exception is a bug of ours.
Outcome = pb.StepResponse | Exception


def handle_step(state: AllocatorState, request: pb.StepRequest) -> pb.StepResponse:
    """One Step (the Step RPC). Raises what the callers map to status codes."""
    (outcome,) = handle_steps(state, [request])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def handle_steps(state: AllocatorState, requests: list[pb.StepRequest]) -> list[Outcome]:
    """Applies the Steps in order through the state gate and journals the applied ones in one
    commit; one outcome per request. A retried step id answers its recorded response and
    journals nothing."""
    outcomes: list[Outcome | None] = [None] * len(requests)
    prepared: list[tuple[int, pb.StepRequest, list[BlockOp], bytes]] = []
    for index, request in enumerate(requests):
        try:
            ops = ops_from_proto(request.ops)
        except Exception as error:  # noqa: BLE001 - answered to its own Step alone
            outcomes[index] = error
            continue
        # A retry is the same request byte for byte; a replay carrying other ops is caught. The
        # digest is of the deterministic serialization, so it does not depend on the transport.
        prepared.append((index, request, ops, request.SerializeToString(deterministic=True)))
    results: list[tuple[int, StepResult]] = []
    try:
        with state.writing() as core:
            changes: list[Change] = []
            for index, request, ops, body in prepared:
                try:
                    result = core.step(request.executor_id, request.epoch, request.step_id, ops,
                                       commands.step_digest(body))
                except Exception as error:  # noqa: BLE001 - answered to its own Step alone
                    state.drop_stray_events()
                    outcomes[index] = error
                    continue
                if not result.replayed:
                    changes.append(state.change(commands.step(body)))
                results.append((index, result))
            if changes:
                state.commit_many(changes)
    except PagedServeError as refused:  # the store refused the batch, or did not take it
        for index, _, _, _ in prepared:
            if outcomes[index] is None:
                outcomes[index] = refused
        return outcomes  # type: ignore[return-value]
    for index, result in results:
        outcomes[index] = step_result_to_proto(result)
    return outcomes  # type: ignore[return-value]
