"""Random interleavings of every allocator call, checked against a model after each step.

The machine plays the executors: it registers (and re-registers) pools, sends Steps, reports
computed tokens, lets leases lapse and resets the prefix cache. Besides the audit, it keeps the
K/V an executor would have written: every slot holds (salt, the tokens up to and including its
own), and every computed token of every live sequence must find exactly that in its block. A
wrong cache hit, a missed copy-on-write or a block handed out twice shows up there.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from allocator_service.core.allocator import Allocator, StepResult
from allocator_service.core.audit import audit_pool
from allocator_service.core.block_hash import BlockHash, hash_packed
from allocator_service.core.errors import StaleEpoch, StepIdReused, StepIdTooOld
from allocator_service.core.executor_pool import ExecutorPool, blocks_for
from pagedserve.protocol.block_ops import (AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp, InvalidOp,
                                           OpStatus)

LEASE_TTL = 10
STEP_LOG_SIZE = 4
EXECUTOR_IDS = ("e0", "e1")
SALTS = ("", "tenant")
# Prompts are one of a few shared prefixes plus a short tail from a small alphabet, so prefix
# hits (and, with the weak hash, collisions) are common.
PREFIXES = ((), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9),
            (7, 7, 7, 7, 7, 7, 7, 7, 7), (1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5))
TOKENS = st.integers(0, 9)
PROMPTS = st.builds(lambda prefix, tail: list(prefix + tuple(tail)) or [0],
                    st.sampled_from(PREFIXES), st.lists(TOKENS, max_size=5))
MALFORMED_OPS = (AllocateOp("", (1,)), AllocateOp("x", (-1,)), AllocateOp("x", ()),
                 ForkOp("y", "y"), AppendOp("x", num_computed_tokens=-1))
# A slot's content: the sequence's salt and every token up to and including the slot's own.
SlotContent = tuple[str, tuple[int, ...]]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> float:
        return self.now


def weak_hash(parent: BlockHash, tokens: bytes) -> BlockHash:
    """Two possible values: most blocks collide, after the same prefix or another one."""
    return BlockHash(bytes([(parent[0] + sum(tokens)) % 2]) * 16)


@dataclass
class SeqModel:
    tokens: list[int]
    salt: str
    num_blocks: int
    num_computed: int


@dataclass
class ExecutorModel:
    epoch: int
    num_blocks: int
    block_size: int
    lease_expires_at: int
    next_step_id: int = 1
    seqs: dict[str, SeqModel] = field(default_factory=dict)
    # The executor's KV memory: block id -> slot -> content written there.
    memory: dict[int, dict[int, SlotContent]] = field(default_factory=dict)
    # (step_id, ops, result) of the last applied step, to retry it.
    last_step: tuple[int, list[BlockOp], StepResult] | None = None
    # The last prompts allocated here, with their salts, to send again (prefix hits).
    prompts: list[tuple[tuple[int, ...], str]] = field(default_factory=list)


class AllocatorMachine(RuleBasedStateMachine):
    hash_fn = staticmethod(hash_packed)

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.allocator = Allocator(lease_ttl_s=LEASE_TTL, step_log_size=STEP_LOG_SIZE,
                                   clock=self.clock, hash_fn=self.hash_fn)
        self.models: dict[str, ExecutorModel] = {}
        self.last_epoch = 0
        self.next_seq = 0

    # -- helpers ----------------------------------------------------------------------------------

    def pool(self, executor_id: str) -> ExecutorPool:
        return self.allocator.executors[executor_id].pool

    def new_seq_id(self) -> str:
        self.next_seq += 1
        return f"s{self.next_seq}"

    def live_seqs(self) -> list[tuple[str, str]]:
        return [(eid, sid) for eid in sorted(self.models) for sid in sorted(self.models[eid].seqs)]

    def write_computed(self, executor_id: str, seq_id: str, upto: int) -> None:
        """The executor writes K/V of the tokens it is about to report computed."""
        model = self.models[executor_id]
        seq = model.seqs[seq_id]
        table = self.pool(executor_id).sequences[seq_id].block_ids()
        size = model.block_size
        for pos in range(seq.num_computed, min(upto, len(seq.tokens))):
            model.memory.setdefault(table[pos // size], {})[pos % size] = (
                seq.salt, tuple(seq.tokens[:pos + 1]))

    def remember_prompt(self, executor_id: str, tokens: list[int], salt: str) -> None:
        model = self.models[executor_id]
        model.prompts = [*model.prompts[-7:], (tuple(tokens), salt)]

    def copy_blocks(self, executor_id: str, copies: list[tuple[int, int]]) -> None:
        memory = self.models[executor_id].memory
        for src, dst in copies:
            memory[dst] = dict(memory.get(src, {}))

    def step(self, executor_id: str, ops: list[BlockOp]) -> StepResult:
        model = self.models[executor_id]
        step_id = model.next_step_id
        result = self.allocator.step(executor_id, model.epoch, step_id, ops)
        model.next_step_id += 1
        model.lease_expires_at = self.clock.now + LEASE_TTL
        model.last_step = (step_id, list(ops), result)
        assert result.replayed is False
        assert len(result.results) == len(ops)
        assert result.num_free_blocks == self.pool(executor_id).num_free_blocks
        return result

    def snapshot(self, executor_id: str):
        pool = self.pool(executor_id)
        return ([(b.ref_count, b.block_hash, b.node_id) for b in pool.blocks.blocks],
                pool.blocks.free_block_ids(),
                {sid: (seq.block_ids(), seq.num_tokens, list(seq.unhashed_token_ids),
                       seq.num_computed_tokens)
                 for sid, seq in pool.sequences.items()})

    def apply_append(self, executor_id: str, op: AppendOp, before: list[int], status: OpStatus,
                     new_blocks: list[int], copies: list[tuple[int, int]]) -> None:
        """Checks an Append's answer against the model and moves the model forward."""
        model = self.models[executor_id]
        seq = model.seqs[op.seq_id]
        if status != OpStatus.OK:
            assert status == OpStatus.OUT_OF_BLOCKS
            return
        size = model.block_size
        num_tokens = len(seq.tokens) + len(op.token_ids)
        num_blocks = max(seq.num_blocks, blocks_for(num_tokens + op.lookahead_slots, size))
        after = self.pool(executor_id).sequences[op.seq_id].block_ids()
        assert len(after) == num_blocks
        assert len(new_blocks) == num_blocks - seq.num_blocks
        assert after[len(before):] == new_blocks
        assert len(copies) <= 1
        if copies:
            ((src, dst),) = copies
            index = len(seq.tokens) // size
            assert op.token_ids, "a copy without a write"
            assert (before[index], after[index]) == (src, dst)
            assert after[:index] + after[index + 1:len(before)] == (
                before[:index] + before[index + 1:])
        else:
            assert after[:len(before)] == before
        self.copy_blocks(executor_id, copies)
        seq.tokens.extend(op.token_ids)
        seq.num_blocks = num_blocks
        if op.num_computed_tokens > seq.num_computed:
            seq.num_computed = min(op.num_computed_tokens, len(seq.tokens))

    # -- executors: register, heartbeat, lease ----------------------------------------------------

    @initialize(num_blocks=st.integers(8, 12), block_size=st.integers(2, 4))
    def first_executor(self, num_blocks: int, block_size: int) -> None:
        self.register("e0", num_blocks, block_size)

    @rule(data=st.data(), event=st.sampled_from(["tick", "tick", "heartbeat", "lease_lapses",
                                                  "register"]))
    def executor_lifecycle(self, data: st.DataObject, event: str) -> None:
        """Time passes (leases lapse), executors heartbeat, register or restart."""
        if event == "register":
            executor_id = data.draw(st.sampled_from(EXECUTOR_IDS))
            self.register(executor_id, data.draw(st.integers(8, 12)), data.draw(st.integers(2, 4)))
            return
        if event == "heartbeat" and self.models:
            executor_id = data.draw(st.sampled_from(sorted(self.models)))
            self.allocator.heartbeat(executor_id, self.models[executor_id].epoch)
            self.models[executor_id].lease_expires_at = self.clock.now + LEASE_TTL
        lapse = event == "lease_lapses"
        self.clock.now += LEASE_TTL + 5 if lapse else data.draw(st.integers(1, 4))
        expired = self.allocator.expire_leases()
        expected = {eid for eid, m in self.models.items() if m.lease_expires_at <= self.clock.now}
        assert sorted(expired) == sorted(expected)
        for executor_id in expired:
            del self.models[executor_id]

    def register(self, executor_id: str, num_blocks: int, block_size: int) -> None:
        """First registration, or a restart: a new epoch and an empty pool."""
        old = self.models.get(executor_id)
        executor = self.allocator.register_executor(executor_id, f"{executor_id}:1", num_blocks,
                                                    block_size, "model")
        assert executor.epoch > self.last_epoch
        self.last_epoch = executor.epoch
        assert executor.pool.sequences == {}
        assert executor.pool.blocks.free_block_ids() == list(range(num_blocks))
        self.models[executor_id] = ExecutorModel(executor.epoch, num_blocks, block_size,
                                                 self.clock.now + LEASE_TTL)
        if old is not None:
            with pytest.raises(StaleEpoch):
                self.allocator.step(executor_id, old.epoch, old.next_step_id, [])

    # -- block operations -------------------------------------------------------------------------

    def allocate_and_check(self, executor_id: str, tokens: list[int], salt: str, lookahead: int,
                           duplicate: bool) -> None:
        model = self.models[executor_id]
        pool = self.pool(executor_id)
        size = model.block_size
        seq_id = sorted(model.seqs)[0] if duplicate and model.seqs else self.new_seq_id()
        needed = blocks_for(len(tokens) + lookahead, size)
        if seq_id in model.seqs:
            expected = OpStatus.ALREADY_EXISTS
        elif needed > model.num_blocks:
            expected = OpStatus.TOO_LARGE
        else:
            cached = pool.num_cached_prefix_tokens(tokens, salt)
            fits = pool.can_allocate(tokens, salt, lookahead)
            expected = OpStatus.OK if fits else OpStatus.OUT_OF_BLOCKS
        before = self.snapshot(executor_id)

        (result,) = self.step(executor_id,
                              [AllocateOp(seq_id, tuple(tokens), salt, lookahead)]).results
        assert result.status == expected
        if expected != OpStatus.OK:
            assert self.snapshot(executor_id) == before
            return
        assert result.num_cached_tokens == cached
        assert result.num_cached_tokens % size == 0
        assert result.num_cached_tokens <= (len(tokens) - 1) // size * size
        assert len(result.block_table) == needed == len(set(result.block_table))
        model.seqs[seq_id] = SeqModel(list(tokens), salt, needed, result.num_cached_tokens)
        self.remember_prompt(executor_id, tokens, salt)

    @precondition(lambda self: self.models)
    @rule(data=st.data(), tokens=PROMPTS, salt=st.sampled_from(SALTS),
          lookahead=st.integers(0, 3), duplicate=st.integers(0, 9))
    def allocate(self, data: st.DataObject, tokens: list[int], salt: str, lookahead: int,
                 duplicate: int) -> None:
        executor_id = data.draw(st.sampled_from(sorted(self.models)))
        self.allocate_and_check(executor_id, tokens, salt, lookahead, duplicate == 0)

    @precondition(lambda self: any(m.prompts or m.seqs for m in self.models.values()))
    @rule(data=st.data(), tail=st.lists(TOKENS, max_size=3), lookahead=st.integers(0, 2))
    def allocate_seen_prompt(self, data: st.DataObject, tail: list[int], lookahead: int) -> None:
        """A prompt this pool has seen, or a live sequence's tokens so far, plus a short tail."""
        executor_id = data.draw(st.sampled_from(sorted(
            eid for eid, m in self.models.items() if m.prompts or m.seqs)))
        model = self.models[executor_id]
        seen = model.prompts[::-1] + [(tuple(seq.tokens), seq.salt)
                                      for _, seq in sorted(model.seqs.items())]
        tokens, salt = data.draw(st.sampled_from(seen))  # the most recent prompts first
        self.allocate_and_check(executor_id, list(tokens) + tail, salt, lookahead, False)

    def append_and_check(self, executor_id: str, seq_id: str, new_tokens: list[int],
                         lookahead: int, computed: int) -> None:
        op = AppendOp(seq_id, tuple(new_tokens), lookahead, computed)
        pool = self.pool(executor_id)
        fits = pool.can_append(seq_id, len(new_tokens), lookahead)
        before = pool.sequences[seq_id].block_ids()
        self.write_computed(executor_id, seq_id, computed)

        (result,) = self.step(executor_id, [op]).results
        assert result.status == (OpStatus.OK if fits else OpStatus.OUT_OF_BLOCKS)
        self.apply_append(executor_id, op, before, result.status, result.new_blocks,
                          result.copies)

    @precondition(lambda self: any(m.seqs for m in self.models.values()))
    @rule(data=st.data(), new_tokens=st.lists(TOKENS, max_size=3), lookahead=st.integers(0, 3),
          report_all=st.booleans())
    def append(self, data: st.DataObject, new_tokens: list[int], lookahead: int,
               report_all: bool) -> None:
        executor_id, seq_id = data.draw(st.sampled_from(self.live_seqs()))
        seq = self.models[executor_id].seqs[seq_id]
        # The executor reports only tokens it has computed, i.e. tokens it held before this op.
        computed = (len(seq.tokens) if report_all
                    else data.draw(st.integers(0, len(seq.tokens))))
        self.append_and_check(executor_id, seq_id, new_tokens, lookahead, computed)

    @precondition(lambda self: any(m.seqs for m in self.models.values()))
    @rule(data=st.data())
    def report_computed(self, data: st.DataObject) -> None:
        """The executor finished a prefill: every token so far is computed, nothing added."""
        executor_id, seq_id = data.draw(st.sampled_from(self.live_seqs()))
        seq = self.models[executor_id].seqs[seq_id]
        self.append_and_check(executor_id, seq_id, [], 0, len(seq.tokens))

    @precondition(lambda self: any(m.seqs for m in self.models.values()))
    @rule(data=st.data())
    def decode_all(self, data: st.DataObject) -> None:
        """One token for every sequence of a pool in one step, reporting all earlier computed."""
        executor_id = data.draw(st.sampled_from(sorted(eid for eid, m in self.models.items()
                                                        if m.seqs)))
        model = self.models[executor_id]
        pool = self.pool(executor_id)
        ops = [AppendOp(sid, (data.draw(TOKENS),), 0, len(seq.tokens))
               for sid, seq in sorted(model.seqs.items())]
        before = {op.seq_id: pool.sequences[op.seq_id].block_ids() for op in ops}
        for op in ops:
            self.write_computed(executor_id, op.seq_id, op.num_computed_tokens)

        results = self.step(executor_id, ops).results
        for op, result in zip(ops, results):
            self.apply_append(executor_id, op, before[op.seq_id], result.status,
                              result.new_blocks, result.copies)

    @precondition(lambda self: any(m.seqs for m in self.models.values()))
    @rule(data=st.data(), duplicate=st.integers(0, 9))
    def fork(self, data: st.DataObject, duplicate: int) -> None:
        executor_id, parent_id = data.draw(st.sampled_from(self.live_seqs()))
        model = self.models[executor_id]
        parent = model.seqs[parent_id]
        others = sorted(set(model.seqs) - {parent_id})
        child_id = others[0] if duplicate == 0 and others else self.new_seq_id()
        shared = self.pool(executor_id).sequences[parent_id].block_ids()[
            :blocks_for(len(parent.tokens), model.block_size)]

        (result,) = self.step(executor_id, [ForkOp(parent_id, child_id)]).results
        if child_id in model.seqs:
            assert result.status == OpStatus.ALREADY_EXISTS
            return
        assert (result.status, result.block_table) == (OpStatus.OK, shared)
        model.seqs[child_id] = SeqModel(list(parent.tokens), parent.salt, len(shared),
                                        parent.num_computed)

    @precondition(lambda self: any(m.seqs for m in self.models.values()))
    @rule(data=st.data(), finished=st.booleans())
    def free(self, data: st.DataObject, finished: bool) -> None:
        """Ends a sequence; a finished one first reports all its tokens computed, in one step."""
        executor_id, seq_id = data.draw(st.sampled_from(self.live_seqs()))
        pool = self.pool(executor_id)
        seq = self.models[executor_id].seqs[seq_id]
        expected_free = pool.num_free_blocks + sum(
            1 for block in pool.sequences[seq_id].block_table if pool.blocks.ref_count(block) == 1)
        ops: list[BlockOp] = [FreeOp(seq_id)]
        if finished:
            self.write_computed(executor_id, seq_id, len(seq.tokens))
            ops.insert(0, AppendOp(seq_id, num_computed_tokens=len(seq.tokens)))
            # Its whole text may come back as (the start of) a prompt: a multi-turn chat.
            self.remember_prompt(executor_id, seq.tokens, seq.salt)
        results = self.step(executor_id, ops).results
        assert [r.status for r in results] == [OpStatus.OK] * len(ops)
        assert pool.num_free_blocks == expected_free
        del self.models[executor_id].seqs[seq_id]

    # -- caller mistakes and retries --------------------------------------------------------------

    @precondition(lambda self: self.models)
    @rule(data=st.data(), mistake=st.sampled_from(["unknown_sequence", "malformed", "retry"]))
    def client_mistake(self, data: st.DataObject, mistake: str) -> None:
        """Each leaves the pool exactly as it was."""
        executor_id = data.draw(st.sampled_from(sorted(self.models)))
        before = self.snapshot(executor_id)
        if mistake == "unknown_sequence":
            self.unknown_sequence(executor_id)
        elif mistake == "malformed":
            self.malformed_step(executor_id, data.draw(st.sampled_from(MALFORMED_OPS)))
        elif self.models[executor_id].last_step is not None:
            self.retry_step(executor_id)
        assert self.snapshot(executor_id) == before

    def unknown_sequence(self, executor_id: str) -> None:
        ghost = self.new_seq_id()
        results = self.step(executor_id, [FreeOp(ghost), AppendOp(ghost, (1,)),
                                          ForkOp(ghost, self.new_seq_id())]).results
        assert [r.status for r in results] == [OpStatus.NOT_FOUND] * 3

    def malformed_step(self, executor_id: str, bad: BlockOp) -> None:
        model = self.models[executor_id]
        ops = [AllocateOp(self.new_seq_id(), (1, 2, 3))]
        ops += [FreeOp(sid) for sid in sorted(model.seqs)] + [bad]
        with pytest.raises(InvalidOp):
            self.allocator.step(executor_id, model.epoch, model.next_step_id, ops)
        model.lease_expires_at = self.clock.now + LEASE_TTL

    def retry_step(self, executor_id: str) -> None:
        model = self.models[executor_id]
        step_id, ops, recorded = model.last_step
        again = self.allocator.step(executor_id, model.epoch, step_id, ops)
        model.lease_expires_at = self.clock.now + LEASE_TTL
        assert again.replayed is True
        assert (again.results, again.num_free_blocks) == (recorded.results,
                                                          recorded.num_free_blocks)
        with pytest.raises(StepIdReused):
            self.allocator.step(executor_id, model.epoch, step_id, ops + [FreeOp("zz")])
        too_old = model.next_step_id - STEP_LOG_SIZE - 1
        if too_old >= 1:
            with pytest.raises(StepIdTooOld):
                self.allocator.step(executor_id, model.epoch, too_old, ops)

    @precondition(lambda self: self.models)
    @rule(data=st.data(), everywhere=st.booleans())
    def reset_prefix_cache(self, data: st.DataObject, everywhere: bool) -> None:
        executor_ids = (sorted(self.models) if everywhere
                        else [data.draw(st.sampled_from(sorted(self.models)))])
        entries = sum(len(self.pool(eid).blocks.hash_index) for eid in executor_ids)
        dropped = self.allocator.reset_prefix_cache("" if everywhere else executor_ids[0])
        assert dropped == entries
        for eid in executor_ids:
            pool = self.pool(eid)
            assert len(pool.blocks.hash_index) == 0
            for seq in self.models[eid].seqs.values():
                assert pool.num_cached_prefix_tokens(seq.tokens, seq.salt) == 0

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def pools_match_the_model(self) -> None:
        assert sorted(self.allocator.executors) == sorted(self.models)
        for executor_id, model in self.models.items():
            executor = self.allocator.executors[executor_id]
            pool = executor.pool
            assert executor.epoch == model.epoch
            assert executor.last_step_id == model.next_step_id - 1
            assert audit_pool(executor_id, pool) == []
            assert sorted(pool.sequences) == sorted(model.seqs)
            size = model.block_size
            for seq_id, expected in model.seqs.items():
                seq = pool.sequences[seq_id]
                assert seq.num_tokens == len(expected.tokens)
                assert (seq.unhashed_token_ids.tolist()
                        == expected.tokens[seq.num_hashed_blocks * size:])
                assert seq.cache_salt == expected.salt
                assert len(seq.block_table) == expected.num_blocks
                assert seq.num_computed_tokens == expected.num_computed
                table = seq.block_ids()
                for pos in range(expected.num_computed):
                    held = model.memory.get(table[pos // size], {}).get(pos % size)
                    assert held == (expected.salt, tuple(expected.tokens[:pos + 1])), (
                        f"{executor_id}/{seq_id}: slot {pos} (block {table[pos // size]}) "
                        f"holds {held}")

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return  # a rule failed already; do not bury its error under this one
        for executor_id, model in self.models.items():
            if model.seqs:
                results = self.step(executor_id, [FreeOp(sid) for sid in sorted(model.seqs)])
                assert [r.status for r in results.results] == [OpStatus.OK] * len(model.seqs)
                model.seqs.clear()
            pool = self.pool(executor_id)
            assert audit_pool(executor_id, pool) == []
            assert pool.num_free_blocks == model.num_blocks
            assert sorted(pool.blocks.free_block_ids()) == list(
                range(model.num_blocks))
            assert all(block.ref_count == 0 for block in pool.blocks.blocks)


class WeakHashAllocatorMachine(AllocatorMachine):
    """The same machine with a hash that collides all the time: no hit may serve other K/V."""
    hash_fn = staticmethod(weak_hash)


STATEFUL_SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)

TestRandomStepsKeepPoolsConsistent = AllocatorMachine.TestCase
TestRandomStepsKeepPoolsConsistent.settings = STATEFUL_SETTINGS
TestCollidingHashNeverServesOtherTokensKV = WeakHashAllocatorMachine.TestCase
TestCollidingHashNeverServesOtherTokensKV.settings = STATEFUL_SETTINGS
