"""The Step itself, for both of its transports: the Step RPC (allocator_servicer.py) and the
Step channel (step_channel.py) call this one module, so the two cannot answer differently.

The channel hands over every Step that arrived in one turn of its event loop. With a store whose
commit is a round trip (Redis), they apply one after another under one hold of the state lock
and are journaled in one commit, before any of their replies goes out (a group commit): one
round trip for all of them. The more executors send at once, the more each round trip carries,
so a busy allocator waits on Redis less per Step. Each Step still succeeds or fails alone; only
a failed commit fails them all. With the in-memory store there is nothing to share, and each
Step is answered as soon as it applied, before the next one applies: near a busy core that
takes about a third off Step p99 (docs/architecture.md#capacity-of-one-allocator).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

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
# Where handle_steps delivers each outcome: (the Step's index in the batch, its outcome).
Answer = Callable[[int, Outcome], None]


def handle_step(state: AllocatorState, request: pb.StepRequest) -> pb.StepResponse:
    """One Step (the Step RPC). Raises what the callers map to status codes."""
    (outcome,) = apply_together(state, [request])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def handle_steps(state: AllocatorState, requests: Sequence[pb.StepRequest | Exception],
                 answer: Answer) -> None:
    """Applies the Steps in order and calls `answer` once for each, in order: after the one
    commit of them all when the store groups commits, else as soon as the Step applied. An
    entry that is an exception already (a Step the caller refused) is answered as it is, in
    its place."""
    if state.store.groups_commits:
        for index, outcome in enumerate(apply_together(state, requests)):
            answer(index, outcome)
        return
    for index, request in enumerate(requests):
        (outcome,) = apply_together(state, [request])
        answer(index, outcome)


def apply_together(state: AllocatorState, requests: Sequence[pb.StepRequest | Exception]
                   ) -> list[Outcome]:
    """Applies the Steps in order through the state gate and journals the applied ones in one
    commit; one outcome per request. A retried step id answers its recorded response and
    journals nothing."""
    outcomes: list[Outcome | None] = [None] * len(requests)
    prepared: list[tuple[int, pb.StepRequest, list[BlockOp], bytes]] = []
    for index, request in enumerate(requests):
        if isinstance(request, Exception):
            outcomes[index] = request
            continue
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
