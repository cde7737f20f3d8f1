"""An allocator group seen as one allocator: a channel to every shard, calls that ask them all
at once, and their answers merged.

Each shard owns the pools of its own executors (allocator_shards.py), so a question about the
whole fleet (which executors exist, which of them hold a prompt's prefix, how full the pools
are, whether every invariant holds) goes to every shard, and the answers are put together as
one allocator would have given them. A single address is a group of one: the gateway and
pagedctl go through here for one allocator too, and get that allocator's answers unchanged.

A shard that does not answer is named beside the merged answers of the others; the caller
decides what that means (the gateway routes on what it has, pagedctl reports the shard and
fails).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.allocator_shards import parse_allocator_group, shard_of
from pagedserve.common.client import open_channel

Reply = TypeVar("Reply")
# PoolStats fields that add up over pools; the rates and percentages are recomputed.
ADDITIVE_STATS = ("num_blocks", "num_free_blocks", "num_cached_free_blocks", "num_used_blocks",
                  "prefix_query_tokens", "prefix_hit_tokens", "tokens_stored",
                  "slots_allocated", "num_sequences")


@dataclass(frozen=True, slots=True)
class ShardAnswers(Generic[Reply]):
    """What each shard said: its reply, or the error it failed with. Both keep shard order."""
    replies: dict[str, Reply]
    failures: dict[str, grpc.RpcError]


class ShardError(grpc.RpcError):
    """A shard's RpcError that names the shard; code() and details() as gRPC's errors."""

    def __init__(self, shard: str, error: grpc.RpcError) -> None:
        super().__init__(f"allocator shard {shard}: {error.details()}")
        self.shard, self.error = shard, error

    def code(self) -> grpc.StatusCode:
        return self.error.code()

    def details(self) -> str:
        return f"allocator shard {self.shard}: {self.error.details()}"


@dataclass(frozen=True, slots=True)
class ListedExecutor:
    shard: str
    info: pb.ExecutorInfo


class AllocatorGroup:
    def __init__(self, shards: Sequence[str], token: str = "", tls_ca: str = "") -> None:
        if not shards:
            raise ValueError("an allocator group needs at least one allocator")
        self.shards = tuple(shards)
        self.channels = {shard: open_channel(shard, token, tls_ca) for shard in self.shards}
        self._admin = {shard: pb_grpc.AllocatorAdminStub(channel)
                       for shard, channel in self.channels.items()}
        self._allocator = {shard: pb_grpc.AllocatorStub(channel)
                           for shard, channel in self.channels.items()}

    @classmethod
    def from_text(cls, text: str, token: str = "", tls_ca: str = "") -> AllocatorGroup:
        """The group `text` lists (HOST:PORT or HOST:PORT,HOST:PORT,...)."""
        return cls(parse_allocator_group(text), token, tls_ca)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

    def ask(self, method: str, request: Any, timeout_s: float, *, admin: bool = True,
            shards: Iterable[str] | None = None) -> ShardAnswers[Any]:
        """Calls `method` (of AllocatorAdmin, or of Allocator when not `admin`) on every shard
        (or on `shards`) at once and waits for all of them, each for at most `timeout_s`."""
        stubs = self._admin if admin else self._allocator
        targets = tuple(shards) if shards is not None else self.shards
        replies: dict[str, Any] = {}
        failures: dict[str, grpc.RpcError] = {}
        if len(targets) == 1:   # no future machinery for the common group of one
            try:
                replies[targets[0]] = getattr(stubs[targets[0]], method)(request,
                                                                         timeout=timeout_s)
            except grpc.RpcError as error:
                failures[targets[0]] = error
            return ShardAnswers(replies, failures)
        calls = {shard: getattr(stubs[shard], method).future(request, timeout=timeout_s)
                 for shard in targets}
        for shard, call in calls.items():
            try:
                replies[shard] = call.result()
            except grpc.RpcError as error:
                failures[shard] = error
        return ShardAnswers(replies, failures)

    def raise_failure(self, failures: dict[str, grpc.RpcError]) -> None:
        """Raises the first of `failures`, if any; in a group of several, as a ShardError that
        names the shard (which of them failed is what an operator needs)."""
        for shard, error in failures.items():
            raise ShardError(shard, error) if len(self.shards) > 1 else error

    def owner(self, executor_id: str) -> str:
        """The shard an executor registers with (allocator_shards.shard_of)."""
        return shard_of(executor_id, self.shards)

    def list_executors(self, timeout_s: float
                       ) -> tuple[dict[str, ListedExecutor], dict[str, grpc.RpcError]]:
        """Every registered executor, by id, with the shard that lists it; and the shards that
        did not answer."""
        answers = self.ask("ListExecutors", pb.ListExecutorsRequest(), timeout_s)
        listed = self._by_executor(
            (shard, info) for shard, reply in answers.replies.items()
            for info in reply.executors)
        return ({executor_id: ListedExecutor(shard, info)
                 for executor_id, (shard, info) in listed.items()}, answers.failures)

    def match_prefix(self, request: pb.MatchPrefixRequest, timeout_s: float
                     ) -> tuple[dict[str, pb.ExecutorMatch], dict[str, grpc.RpcError]]:
        """Each live executor's match for the prompt, by id (each shard knows exactly what
        its own pools hold, so the union is exact); and the shards that did not answer."""
        answers = self.ask("MatchPrefix", request, timeout_s, admin=False)
        matches = self._by_executor((shard, match) for shard, reply in answers.replies.items()
                                    for match in reply.executors)
        return {executor_id: match for executor_id, (_, match) in matches.items()}, \
            answers.failures

    def _by_executor(self, found: Iterable[tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
        """Entries keyed by executor id. An executor two shards list (it moved when the shard
        list changed, and its old pool has not lapsed yet) counts at its owner."""
        entries: dict[str, tuple[str, Any]] = {}
        for shard, entry in found:
            known = entries.get(entry.executor_id)
            if known is None or shard == self.owner(entry.executor_id):
                entries[entry.executor_id] = (shard, entry)
        return dict(sorted(entries.items()))


def merge_stats(replies: Sequence[pb.GetStatsResponse]) -> pb.GetStatsResponse:
    """One GetStats answer for the whole group: every pool (by executor id), their total, the
    state stores joined (each shard has its own namespace) and the journal positions summed."""
    if len(replies) == 1:
        return replies[0]
    pools = sorted((pool for reply in replies for pool in reply.pools),
                   key=lambda pool: pool.executor_id)
    stores = list(dict.fromkeys(reply.state_store for reply in replies))
    return pb.GetStatsResponse(pools=pools, total=total_of(pools),
                               state_store=", ".join(stores),
                               applied_seq=sum(reply.applied_seq for reply in replies))


def total_of(pools: Sequence[pb.PoolStats]) -> pb.PoolStats:
    """The sum over `pools`, as an allocator computes its own total: named "total",
    block_size 0 when the pools' block sizes differ."""
    total = pb.PoolStats(executor_id="total")
    histogram: Counter[int] = Counter()
    for pool in pools:
        for name in ADDITIVE_STATS:
            setattr(total, name, getattr(total, name) + getattr(pool, name))
        for bucket in pool.refcount_histogram:
            histogram[bucket.ref_count] += bucket.num_blocks
    sizes = {pool.block_size for pool in pools}
    total.block_size = sizes.pop() if len(sizes) == 1 else 0
    total.usage_percent = (100.0 * total.num_used_blocks / total.num_blocks
                           if total.num_blocks else 0.0)
    total.prefix_hit_rate = (total.prefix_hit_tokens / total.prefix_query_tokens
                             if total.prefix_query_tokens else 0.0)
    total.refcount_histogram.extend(
        pb.RefcountBucket(ref_count=count, num_blocks=histogram[count])
        for count in sorted(histogram))
    return total


def merge_audits(replies: dict[str, pb.AuditResponse]) -> pb.AuditResponse:
    """One Audit answer: the pools and blocks checked summed, and every violation, prefixed by
    its shard when there are several."""
    if len(replies) == 1:
        return next(iter(replies.values()))
    return pb.AuditResponse(
        violations=[f"shard {shard}: {violation}" for shard, reply in replies.items()
                    for violation in reply.violations],
        num_pools=sum(reply.num_pools for reply in replies.values()),
        num_blocks=sum(reply.num_blocks for reply in replies.values()))
