"""The changes the state store journals, and how replay applies them to a core again.

The journal holds what came in, not what it did: the core is deterministic, so applying the same
commands in the same order to the same snapshot rebuilds the same state (block ids, LRU order,
node ids, epochs, recorded step results). A Step is journaled as the request bytes it arrived
as, which are also what its retry digest is computed from.

    kind        body                                   applied by
    register    RegisterExecutorRequest (protobuf)     Allocator.register_executor
    step        StepRequest (protobuf, deterministic)  Allocator.step
    reclaim     JSON [[executor_id, epoch], ...]       Allocator.reclaim
    reset       ResetPrefixCacheRequest (protobuf)     Allocator.reset_prefix_cache

Leases and heartbeats are not journaled: they are about time, and time restarts with the process.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b

from allocator_service.core.allocator import Allocator
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_codec import ops_from_proto


@dataclass(slots=True, frozen=True)
class Command:
    kind: str
    body: bytes


def step_digest(step_request_bytes: bytes) -> bytes:
    """What identifies a Step for retries: the hash of its deterministic serialization."""
    return blake2b(step_request_bytes, digest_size=16).digest()


def register(request: pb.RegisterExecutorRequest) -> Command:
    return Command("register", request.SerializeToString(deterministic=True))


def executor_index_of(request: pb.RegisterExecutorRequest) -> int | None:
    """The registration's executor index; None when the field is unset (an executor without a
    number, and every registration journaled before the field existed)."""
    return request.executor_index if request.HasField("executor_index") else None


def step(request_bytes: bytes) -> Command:
    return Command("step", request_bytes)


def reclaim(expired: Sequence[tuple[str, int]]) -> Command:
    return Command("reclaim", json.dumps([list(pair) for pair in expired]).encode())


def reset(request: pb.ResetPrefixCacheRequest) -> Command:
    return Command("reset", request.SerializeToString(deterministic=True))


class CorruptJournal(RuntimeError):
    """A journaled command does not apply: the stored state is not what this code wrote."""


def apply(core: Allocator, command: Command) -> None:
    """Replays one journaled command; it must apply exactly as it did the first time."""
    try:
        if command.kind == "step":
            request = pb.StepRequest.FromString(command.body)
            result = core.step(request.executor_id, request.epoch, request.step_id,
                               ops_from_proto(request.ops), step_digest(command.body))
            if result.replayed:
                raise CorruptJournal(f"step {request.step_id} of {request.executor_id!r} is "
                                     "journaled twice")
        elif command.kind == "register":
            registration = pb.RegisterExecutorRequest.FromString(command.body)
            core.register_executor(registration.executor_id, registration.address,
                                   registration.num_blocks, registration.block_size,
                                   registration.model_fingerprint,
                                   executor_index=executor_index_of(registration))
        elif command.kind == "reclaim":
            core.reclaim([(executor_id, epoch) for executor_id, epoch in json.loads(command.body)])
        elif command.kind == "reset":
            core.reset_prefix_cache(pb.ResetPrefixCacheRequest.FromString(command.body).executor_id)
        else:
            raise CorruptJournal(f"unknown command kind {command.kind!r}")
    except CorruptJournal:
        raise
    except Exception as error:  # noqa: BLE001 - any failure here means the journal is unusable
        raise CorruptJournal(f"journaled {command.kind} does not apply: {error}") from error
