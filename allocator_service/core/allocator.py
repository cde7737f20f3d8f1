"""The allocator core: every executor's pool, their leases, and the batched, idempotent Step.

Pure Python: no gRPC, no Redis. The server calls it from one thread at a time (it holds one
lock), so no caller ever sees a half-applied step.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from allocator_service.core.block_hash import HashFn, hash_packed
from allocator_service.core.errors import (ExecutorIndexTaken, StaleEpoch, StepIdReused,
                                           StepIdTooOld, UnknownExecutor)
from allocator_service.core.executor_pool import NO_GROWTH, ExecutorPool, PromptTooLarge
from allocator_service.core.kv_events import KvEventLog, PoolEvents, PoolResetReason
from allocator_service.core.step_wire import (PackedResult, decode_step_response,
                                             encode_step_response)
from allocator_service.core.validation import validate_ops, validate_prompt, validate_registration
from pagedserve.common.errors import AlreadyExists, NotFound
from pagedserve.protocol.block_ops import (OK, AllocateOp, AppendOp, BlockOp, ForkOp, InvalidOp,
                                           OpResult, OpStatus, SeqId, StepResult)
from pagedserve.protocol.limits import Limits


class RecordedStep:
    """A step's result kept for answering its retries.

    Kept as its answer's StepResponse bytes (`answer`, core/step_wire.py): one bytes object,
    which the cyclic collector never tracks. Each executor's last 64 results live for seconds,
    so as objects or tuples (tens of thousands of them in a fleet) every one would be walked
    by a collection at least once. They are also the very bytes the Step channel sends
    (`StepResult.encoded`), so keeping an answer costs no more than writing it once: until
    2026-11-28 the results were marshalled here and encoded again for the reply. Retries and
    snapshots, which read them back, are rare.
    """

    __slots__ = ("identity", "answer")

    def __init__(self, identity: bytes | list[BlockOp], result: StepResult) -> None:
        # What identifies the request: the caller's digest of it (the server hashes the
        # serialized request), or else the list of ops itself, compared with ==.
        self.identity = identity
        self.answer = encode_step_response(result)

    @property
    def packed_result(self) -> tuple[int, list[PackedResult]]:
        """The result as plain values, without building result objects: (num_free_blocks, one
        (status, message, block_table, num_cached_tokens, new_blocks, copies) per op)."""
        return decode_step_response(self.answer)

    @property
    def result(self) -> StepResult:
        num_free_blocks, results = self.packed_result
        return StepResult([OpResult(OpStatus(status), message, table, cached, new, copies)
                           for status, message, table, cached, new, copies in results],
                          num_free_blocks)


@dataclass(slots=True)
class RegisteredExecutor:
    executor_id: str
    address: str
    epoch: int
    model_fingerprint: str
    pool: ExecutorPool
    lease_expires_at: float
    # Its number in the fleet (--executor-index), or None; no two registered executors share one.
    executor_index: int | None = None
    num_waiting: int = 0
    num_running: int = 0
    last_step_id: int = 0
    # The most recent steps' responses, oldest first, for answering retries.
    step_log: OrderedDict[int, RecordedStep] = field(default_factory=OrderedDict)


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    executor_id: str
    address: str
    num_cached_tokens: int
    num_free_blocks: int
    num_blocks: int
    num_waiting: int
    num_running: int
    num_sequences: int


class Allocator:
    def __init__(self, limits: Limits | None = None, lease_ttl_s: float = 10.0,
                 step_log_size: int = 64, clock: Callable[[], float] = time.monotonic,
                 hash_fn: HashFn = hash_packed) -> None:
        self.limits = limits or Limits()
        self.lease_ttl_s = lease_ttl_s
        self.step_log_size = step_log_size
        self.clock = clock
        self.hash_fn = hash_fn
        self.executors: dict[str, RegisteredExecutor] = {}
        self.last_epoch = 0
        # Prefix-cache changes of every pool, numbered; the state store takes them after each
        # change and publishes them with it.
        self.events = KvEventLog()

    def empty_like(self) -> Allocator:
        """A new allocator with these settings and no state (to load into from scratch)."""
        return Allocator(self.limits, self.lease_ttl_s, self.step_log_size, self.clock,
                         self.hash_fn)

    # -- registration and lease ------------------------------------------------------------

    def build_pool(self, executor_id: str, address: str, num_blocks: int, block_size: int,
                   model_fingerprint: str, executor_index: int | None = None) -> ExecutorPool:
        """Validates a registration and builds its empty pool without touching any state, so
        the server can do it outside its lock (about a second per million blocks)."""
        validate_registration(self.limits, executor_id, address, num_blocks, block_size,
                              executor_index)
        return ExecutorPool(num_blocks, block_size, model_fingerprint, self.hash_fn)

    def register_executor(self, executor_id: str, address: str, num_blocks: int,
                          block_size: int, model_fingerprint: str,
                          pool: ExecutorPool | None = None,
                          executor_index: int | None = None) -> RegisteredExecutor:
        """Creates the executor's pool, or resets it if the executor was registered already
        (an executor registers when it starts, so its old KV memory is gone). `pool` is one
        made by build_pool for the same arguments. An index another registered executor holds
        is refused, changing nothing: registered executors hold distinct indexes (one whose
        lease lapsed holds its index until its pool is reclaimed)."""
        if pool is None:
            pool = self.build_pool(executor_id, address, num_blocks, block_size,
                                   model_fingerprint, executor_index)
        if executor_index is not None:
            for other in self.executors.values():
                if other.executor_index == executor_index and other.executor_id != executor_id:
                    raise ExecutorIndexTaken(executor_id, executor_index, other.executor_id,
                                             self.lease_remaining(other))
        self.last_epoch += 1
        executor = RegisteredExecutor(
            executor_id=executor_id, address=address, epoch=self.last_epoch,
            model_fingerprint=model_fingerprint, pool=pool,
            lease_expires_at=self.clock() + self.lease_ttl_s, executor_index=executor_index)
        self.add_executor(executor)
        self.events.pool_reset(executor_id, PoolResetReason.REGISTERED, pool.num_blocks,
                               pool.block_size)
        return executor

    def add_executor(self, executor: RegisteredExecutor) -> None:
        """Installs a registered executor (new, or restored from a snapshot) and wires its
        pool's prefix-cache changes into the event log."""
        executor.pool.blocks.events = PoolEvents(self.events, executor.executor_id)
        self.executors[executor.executor_id] = executor

    def heartbeat(self, executor_id: str, epoch: int, num_waiting: int = 0,
                  num_running: int = 0) -> None:
        executor = self.live_executor(executor_id, epoch)
        executor.num_waiting, executor.num_running = max(0, num_waiting), max(0, num_running)

    def live_executor(self, executor_id: str, epoch: int) -> RegisteredExecutor:
        """The executor at this epoch, with its lease renewed: any call from it shows it lives."""
        executor = self.executors.get(executor_id)
        if executor is None:
            raise UnknownExecutor(executor_id)
        if epoch != executor.epoch:
            raise StaleEpoch(executor_id, epoch, executor.epoch)
        executor.lease_expires_at = self.clock() + self.lease_ttl_s
        return executor

    def expired_leases(self) -> list[tuple[str, int]]:
        """(executor id, epoch) of every executor whose lease lapsed; changes nothing."""
        now = self.clock()
        return [(eid, ex.epoch) for eid, ex in self.executors.items()
                if ex.lease_expires_at <= now]

    def reclaim(self, expired: Sequence[tuple[str, int]]) -> list[str]:
        """Drops the pools of these (executor id, epoch) pairs, skipping any executor that has
        re-registered since (its epoch moved on); returns the executor ids dropped."""
        dropped = []
        for executor_id, epoch in expired:
            executor = self.executors.get(executor_id)
            if executor is None or executor.epoch != epoch:
                continue
            del self.executors[executor_id]
            self.events.pool_reset(executor_id, PoolResetReason.LEASE_EXPIRED)
            dropped.append(executor_id)
        return dropped

    def expire_leases(self) -> list[str]:
        """Reclaims every pool whose lease lapsed; returns their executor ids."""
        return self.reclaim(self.expired_leases())

    # -- step ----------------------------------------------------------------------------------

    def step(self, executor_id: str, epoch: int, step_id: int, ops: Sequence[BlockOp],
             digest: bytes | None = None) -> StepResult:
        """Applies the ops in order, each succeeding or failing alone, exactly once per step_id.

        A malformed request raises before any op applies. A step_id at or below the last one
        is a retry: the recorded result comes back (marked replayed) and nothing applies.
        `digest` identifies the request for that check; without one the ops are compared.
        """
        executor = self.live_executor(executor_id, epoch)
        if step_id < 1:
            raise InvalidOp(f"step_id must be at least 1, got {step_id}")
        identity = digest if digest is not None else list(ops)
        if step_id <= executor.last_step_id:
            return self._replay(executor, step_id, identity)
        validate_ops(self.limits, ops)
        pool = executor.pool
        result = StepResult([self._apply(pool, op) for op in ops], pool.num_free_blocks)
        executor.last_step_id = step_id
        recorded = RecordedStep(identity, result)
        result.encoded = recorded.answer
        executor.step_log[step_id] = recorded
        if len(executor.step_log) > self.step_log_size:
            executor.step_log.popitem(last=False)
        return result

    def _replay(self, executor: RegisteredExecutor, step_id: int,
                identity: bytes | list[BlockOp]) -> StepResult:
        recorded = executor.step_log.get(step_id)
        if recorded is None:
            raise StepIdTooOld(
                f"step_id {step_id} of executor {executor.executor_id!r} is not above the last "
                f"applied step id {executor.last_step_id} and no result is recorded for it "
                f"(never applied, or older than the {self.step_log_size} kept); new steps need "
                "increasing ids")
        if recorded.identity != identity:
            raise StepIdReused(
                f"step_id {step_id} of executor {executor.executor_id!r} was already applied "
                "with different ops; use a new step_id for new ops")
        return replace(recorded.result, replayed=True)

    @staticmethod
    def _apply(pool: ExecutorPool, op: BlockOp) -> OpResult:
        try:
            if isinstance(op, AppendOp):  # the hot path: one per running sequence per step
                growth = pool.append(op.seq_id, op.token_ids, op.lookahead_slots,
                                     op.num_computed_tokens)
                if growth is None:
                    return _out_of_blocks(pool)
                if growth is NO_GROWTH:
                    return OK
                # Positional: a third cheaper than keywords into the dataclass's __init__.
                return OpResult(OpStatus.OK, "", [], 0, growth.new_blocks, growth.copies)
            if isinstance(op, AllocateOp):
                allocation = pool.allocate(op.seq_id, op.token_ids, op.cache_salt,
                                           op.lookahead_slots)
                if allocation is None:
                    return _out_of_blocks(pool)
                return OpResult(OpStatus.OK, "", allocation.block_table,
                                allocation.num_cached_tokens, [], [])
            if isinstance(op, ForkOp):
                return OpResult(block_table=pool.fork(op.parent_seq_id, op.child_seq_id))
            pool.free(op.seq_id)
            return OK
        except NotFound as error:
            return OpResult(OpStatus.NOT_FOUND, str(error))
        except AlreadyExists as error:
            return OpResult(OpStatus.ALREADY_EXISTS, str(error))
        except PromptTooLarge as error:
            return OpResult(OpStatus.TOO_LARGE, str(error))

    # -- routing -------------------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], cache_salt: str) -> list[PrefixMatch]:
        """Per registered executor: prompt tokens its pool would serve from cache, and its load."""
        validate_prompt(self.limits, token_ids, cache_salt)
        return [
            PrefixMatch(
                executor_id=ex.executor_id, address=ex.address,
                num_cached_tokens=ex.pool.num_cached_prefix_tokens(token_ids, cache_salt),
                num_free_blocks=ex.pool.num_free_blocks, num_blocks=ex.pool.num_blocks,
                num_waiting=ex.num_waiting, num_running=ex.num_running,
                num_sequences=len(ex.pool.sequences))
            for ex in self.sorted_executors()
        ]

    # -- admin -------------------------------------------------------------------------------

    def sorted_executors(self, executor_id: str = "") -> list[RegisteredExecutor]:
        """All executors in id order, or just the one named (NotFound when unknown)."""
        if executor_id:
            executor = self.executors.get(executor_id)
            if executor is None:
                raise UnknownExecutor(executor_id)
            return [executor]
        return [self.executors[eid] for eid in sorted(self.executors)]

    def lease_remaining(self, executor: RegisteredExecutor) -> float:
        return max(0.0, executor.lease_expires_at - self.clock())

    def find_sequence(self, executor_id: str, seq_id: str) -> tuple[RegisteredExecutor, SeqId]:
        """The executor holding seq_id; with no executor given, the id must be unique."""
        holders = [ex for ex in self.sorted_executors(executor_id)
                   if SeqId(seq_id) in ex.pool.sequences]
        if not holders:
            raise NotFound(f"no pool holds sequence {seq_id!r}"
                           + (f" on executor {executor_id!r}" if executor_id else ""))
        if len(holders) > 1:
            raise InvalidOp(f"sequence {seq_id!r} exists on several executors "
                            f"({', '.join(ex.executor_id for ex in holders)}); name one")
        return holders[0], SeqId(seq_id)

    def announce_every_index(self) -> None:
        """Emits, per pool, PoolReset(resync) and then every prefix-cache entry as stored, so
        an event reader that lost events rebuilds each index from here. Changes no state."""
        for executor in self.sorted_executors():
            pool = executor.pool
            self.events.pool_reset(executor.executor_id, PoolResetReason.RESYNC,
                                   pool.num_blocks, pool.block_size)
            pool.blocks.announce_entries()

    def reset_prefix_cache(self, executor_id: str = "") -> int:
        """Drops every prefix-cache entry of one pool, or of all; returns how many."""
        dropped = 0
        for executor in self.sorted_executors(executor_id):
            dropped += executor.pool.reset_prefix_cache()
            self.events.pool_reset(executor.executor_id, PoolResetReason.PREFIX_CACHE_RESET,
                                   executor.pool.num_blocks, executor.pool.block_size)
        return dropped


def _out_of_blocks(pool: ExecutorPool) -> OpResult:
    return OpResult(OpStatus.OUT_OF_BLOCKS,
                    f"out of blocks: {pool.num_free_blocks} of {pool.num_blocks} free")
