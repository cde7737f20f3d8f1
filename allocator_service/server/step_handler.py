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

from allocator_service.core.allocator import Allocator
from allocator_service.core.step_wire import DecodedStep
from allocator_service.durability import commands
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import Change
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.errors import PagedServeError
from pagedserve.protocol.block_codec import ops_from_proto
from pagedserve.protocol.block_ops import StepResult

# What a Step comes to: its result (each transport encodes it its own way), or why it has none.
# A PagedServeError is the caller's (an UNAVAILABLE store, a stale epoch, a malformed op); any
# other exception is a bug of ours.
Outcome = StepResult | Exception
# Where handle_steps delivers each outcome: (the Step's index in the batch, its outcome).
Answer = Callable[[int, Outcome], None]


def decoded(request: pb.StepRequest) -> DecodedStep:
    """A Step that protobuf parsed (the Step RPC's, or one the Step channel's reader left to
    protobuf), ready to apply. Raises InvalidOp for a malformed op. Its identity is its
    deterministic serialization: a retry is the same request, byte for byte, on either path."""
    return DecodedStep(request.executor_id, request.epoch, request.step_id,
                       ops_from_proto(request.ops), request.SerializeToString(deterministic=True))


def handle_step(state: AllocatorState, request: pb.StepRequest) -> StepResult:
    """One Step (the Step RPC). Raises what the callers map to status codes."""
    (outcome,) = apply_together(state, [decoded(request)])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def handle_steps(state: AllocatorState, steps: Sequence[DecodedStep | Exception],
                 answer: Answer) -> None:
    """Applies the Steps in order and calls `answer` once for each, in order: after the one
    commit of them all when the store groups commits, else as soon as the Step applied. An
    entry that is an exception already (a Step the caller refused) is answered as it is, in
    its place."""
    if state.store.groups_commits:
        for index, outcome in enumerate(apply_together(state, steps)):
            answer(index, outcome)
        return
    for index, step in enumerate(steps):
        answer(index, step if isinstance(step, Exception) else apply_alone(state, step))


def apply_alone(state: AllocatorState, step: DecodedStep) -> Outcome:
    """One Step applied and committed on its own (a store that does not group commits): what
    apply_together does for a batch of one, with less Python around it (a busy in-memory
    allocator applies thousands a second)."""
    try:
        with state.writing() as core:
            outcome = _step(state, core, step)
            if isinstance(outcome, StepResult) and not outcome.replayed:
                state.commit(commands.step(step.body))
            return outcome
    except PagedServeError as refused:  # the store refused the change, or takes none now
        return refused


def _step(state: AllocatorState, core: Allocator, step: DecodedStep) -> Outcome:
    """The Step applied to the core (inside `state.writing()`), or why it was not: a failed
    Step is answered alone, and the events it emitted before it raised are dropped."""
    try:
        return core.step(step.executor_id, step.epoch, step.step_id, step.ops,
                         commands.step_digest(step.body))
    except Exception as error:  # noqa: BLE001 - this Step's own outcome
        state.drop_stray_events()
        return error


def apply_together(state: AllocatorState, steps: Sequence[DecodedStep | Exception]
                   ) -> list[Outcome]:
    """Applies the Steps in order through the state gate and journals the applied ones in one
    commit; one outcome per Step. A retried step id answers its recorded result and journals
    nothing."""
    outcomes: list[Outcome | None] = [step if isinstance(step, Exception) else None
                                      for step in steps]
    results: list[tuple[int, StepResult]] = []
    try:
        with state.writing() as core:
            changes: list[Change] = []
            for index, step in enumerate(steps):
                if isinstance(step, Exception):
                    continue
                outcome = _step(state, core, step)
                if not isinstance(outcome, StepResult):
                    outcomes[index] = outcome
                    continue
                if not outcome.replayed:
                    changes.append(state.change(commands.step(step.body)))
                results.append((index, outcome))
            if changes:
                state.commit_many(changes)
    except PagedServeError as refused:  # the store refused the batch, or did not take it
        return [refused if outcome is None else outcome for outcome in outcomes]
    for index, result in results:
        outcomes[index] = result
    return outcomes  # type: ignore[return-value]
