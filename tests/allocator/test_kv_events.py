"""KV events: what enters and leaves each pool's prefix cache, numbered, and how the in-memory
store keeps them for readers.

A reader that applies the events in order must hold an exact copy of every pool's hash index:

    BlockStored   index[hash] = (block id, parent hash, tokens)
    BlockRemoved  del index[hash]
    PoolReset     index = {}
"""
from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant

from allocator_service.core.allocator import Allocator
from allocator_service.core.block_hash import chain_hash, pack_tokens, root_hash
from allocator_service.core.kv_events import (NO_EVENTS, KvEvent, KvEventType, PackedEvents,
                                              PoolResetReason, pack, records, unpack)
from allocator_service.durability import commands
from allocator_service.durability.commands import Command
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import MemoryStore
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, ForkOp, FreeOp
from tests.allocator.test_allocator_stateful import AllocatorMachine, WeakHashAllocatorMachine
from tests.support.allocator_core import A10, BLOCK_SIZE, NUM_BLOCKS, parent_blind_hash, step

STORED, REMOVED, RESET = (KvEventType.BLOCK_STORED, KvEventType.BLOCK_REMOVED,
                          KvEventType.POOL_RESET)
ROOT = root_hash("m", "")


def stored(seq: int, block_id: int, block_hash: bytes, parent_hash: bytes, tokens,
           executor_id: str = "e") -> KvEvent:
    return KvEvent(seq, STORED, executor_id, block_id=block_id, block_hash=block_hash,
                   parent_hash=parent_hash, token_ids=tuple(tokens))


def removed(seq: int, block_id: int, block_hash: bytes, executor_id: str = "e") -> KvEvent:
    return KvEvent(seq, REMOVED, executor_id, block_id=block_id, block_hash=block_hash)


def reset(seq: int, reason: str, num_blocks: int = NUM_BLOCKS, block_size: int = BLOCK_SIZE,
          executor_id: str = "e") -> KvEvent:
    return KvEvent(seq, RESET, executor_id, reason=reason, num_blocks=num_blocks,
                   block_size=block_size)


def new_core(**kwargs) -> Allocator:
    core = Allocator(**kwargs)
    core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    return core


class IndexMirror:
    """A strict reader of the event stream: the index copy of every pool."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.index: dict[str, dict[bytes, tuple[int, bytes, tuple[int, ...]]]] = {}
        self.sizes: dict[str, tuple[int, int]] = {}

    def apply(self, events: list[KvEvent]) -> None:
        for event in events:
            assert event.seq == self.last_seq + 1, f"seq {event.seq} after {self.last_seq}"
            self.last_seq = event.seq
            if event.type is RESET:
                self.index[event.executor_id] = {}
                self.sizes[event.executor_id] = (event.num_blocks, event.block_size)
                continue
            pool = self.index.setdefault(event.executor_id, {})
            if event.type is STORED:
                assert event.block_hash not in pool, f"{event} stores over a present entry"
                pool[event.block_hash] = (event.block_id, event.parent_hash, event.token_ids)
            else:
                assert pool.get(event.block_hash, (None,))[0] == event.block_id, (
                    f"{event} removes an entry that is not there")
                del pool[event.block_hash]

    def check(self, core: Allocator) -> None:
        for executor_id, executor in core.executors.items():
            blocks = executor.pool.blocks
            assert self.index.get(executor_id) == {
                h: (b.block_id, b.parent_hash, b.token_ids) for h, b in blocks.index_entries()}
            assert self.sizes[executor_id] == (executor.pool.num_blocks, executor.pool.block_size)
        for executor_id in set(self.index) - set(core.executors):
            assert self.index[executor_id] == {}, f"{executor_id} is gone but has entries"
            assert self.sizes[executor_id] == (0, 0)


# -- exact sequences ------------------------------------------------------------------------------

def test_registration_resets_the_pool_with_its_size():
    core = Allocator()
    core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    core.register_executor("f", "f:1", 7, 2, "m")
    core.register_executor("e", "e:1", 5, 8, "m")  # a restart, with another pool
    assert core.events.drain() == [reset(1, "registered"), reset(2, "registered", 7, 2, "f"),
                                   reset(3, "registered", 5, 8)]
    assert core.events.drain() == []
    assert core.events.last_seq == 3


def test_computed_blocks_are_stored_in_chain_order_as_the_computed_mark_crosses_them():
    core = new_core()
    core.events.drain()
    h0 = chain_hash(ROOT, (0, 1, 2, 3))
    h1 = chain_hash(h0, (4, 5, 6, 7))
    h2 = chain_hash(h1, (8, 9, 10, 11))

    step(core, "e", AllocateOp("a", tuple(A10)))
    assert core.events.drain() == []  # nothing computed yet
    step(core, "e", AppendOp("a", num_computed_tokens=3))
    assert core.events.drain() == []  # block 0 not full of computed tokens yet
    step(core, "e", AppendOp("a", num_computed_tokens=5))
    assert core.events.drain() == [stored(2, 0, h0, ROOT, (0, 1, 2, 3))]
    step(core, "e", AppendOp("a", (10, 11), num_computed_tokens=10))
    assert core.events.drain() == [stored(3, 1, h1, h0, (4, 5, 6, 7))]
    step(core, "e", AppendOp("a", num_computed_tokens=12))
    assert core.events.drain() == [stored(4, 2, h2, h1, (8, 9, 10, 11))]

    # Several blocks in one op, in order; another salt chains from its own root.
    troot = root_hash("m", "t")
    c0 = chain_hash(troot, (100, 101, 102, 103))
    c1 = chain_hash(c0, (104, 105, 106, 107))
    c2 = chain_hash(c1, (108, 109, 110, 111))
    step(core, "e", AllocateOp("c", tuple(range(100, 113)), "t"),
         AppendOp("c", num_computed_tokens=13))
    assert core.events.drain() == [stored(5, 3, c0, troot, range(100, 104)),
                                   stored(6, 4, c1, c0, range(104, 108)),
                                   stored(7, 5, c2, c1, range(108, 112))]


def test_hits_and_blocks_already_cached_elsewhere_store_nothing():
    core = new_core()
    step(core, "e", AllocateOp("a", tuple(A10)), AllocateOp("d", tuple(A10)))
    step(core, "e", AppendOp("a", num_computed_tokens=10))
    core.events.drain()
    h0 = chain_hash(ROOT, (0, 1, 2, 3))
    h1 = chain_hash(h0, (4, 5, 6, 7))
    # d computed the same prefix in other blocks (3, 4): the index keeps a's entries.
    step(core, "e", AppendOp("d", num_computed_tokens=10))
    assert core.events.drain() == []
    # b hits 0 and 1; only its own third block is new when computed.
    result = step(core, "e", AllocateOp("b", tuple(A10[:8]) + (50, 51, 52, 53)),
                  AppendOp("b", num_computed_tokens=12))
    assert result.results[0].num_cached_tokens == 8
    assert core.events.drain() == [stored(4, 6, chain_hash(h1, (50, 51, 52, 53)), h1,
                                          (50, 51, 52, 53))]
    # A fork and its copy-on-write store nothing by themselves.
    step(core, "e", ForkOp("a", "a2"), AppendOp("a2", (10,)))
    assert core.events.drain() == []


def test_taking_a_cached_free_block_removes_its_entry():
    core = new_core()
    step(core, "e", AllocateOp("a", tuple(A10)), AppendOp("a", (10, 11), 0, 12))
    h0 = chain_hash(ROOT, (0, 1, 2, 3))
    h1 = chain_hash(h0, (4, 5, 6, 7))
    h2 = chain_hash(h1, (8, 9, 10, 11))
    step(core, "e", FreeOp("a"))  # free list: 3..10, then 2, 1, 0 (cached, LRU last)
    core.events.drain()
    result = step(core, "e", AllocateOp("b", tuple(range(100, 133))))  # 9 blocks
    assert result.results[0].block_table == [3, 4, 5, 6, 7, 8, 9, 10, 2]
    assert core.events.drain() == [removed(5, 2, h2)]
    # The next two cached ones go in LRU order too, each removed as it is taken.
    step(core, "e", AllocateOp("c", (1,)), AllocateOp("d", (2,)))
    assert core.events.drain() == [removed(6, 1, h1), removed(7, 0, h0)]
    # A hit on a cached-free block takes it back without removing anything.
    core2 = new_core()
    step(core2, "e", AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10), FreeOp("a"))
    core2.events.drain()
    step(core2, "e", AllocateOp("b", tuple(A10)))
    assert core2.events.drain() == []


def test_reset_prefix_cache_is_one_pool_reset_per_pool_without_removals():
    core = new_core()
    core.register_executor("f", "f:1", 6, 2, "m")
    step(core, "e", AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10))
    core.events.drain()
    assert core.reset_prefix_cache("e") == 2
    assert core.events.drain() == [reset(5, "prefix_cache_reset")]
    assert core.reset_prefix_cache() == 0
    assert core.events.drain() == [reset(6, "prefix_cache_reset"),
                                   reset(7, "prefix_cache_reset", 6, 2, "f")]
    # Entries were dropped without events: taking the blocks later removes nothing more.
    step(core, "e", FreeOp("a"), AllocateOp("b", tuple(range(100, 144))))
    assert core.events.drain() == []


def test_a_lapsed_lease_resets_the_pool_as_gone():
    now = [0.0]
    core = new_core(lease_ttl_s=5, clock=lambda: now[0])
    core.register_executor("f", "f:1", 6, 2, "m")
    step(core, "e", AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10))
    core.events.drain()
    now[0] = 3.0
    core.heartbeat("f", 2)
    now[0] = 6.0
    assert core.expire_leases() == ["e"]
    assert core.events.drain() == [reset(5, "lease_expired", 0, 0)]
    # A reclaim naming an epoch the pool has left behind changes (and reports) nothing.
    assert core.reclaim([("f", 1)]) == []
    assert core.events.drain() == []
    assert core.events.num_pending == 0 and core.events.last_seq == 5


def test_an_unreachable_entry_replaced_on_a_collision_is_removed_then_stored():
    """With a hash that ignores the chain, a block of 2 2 2 2 collides with any other one."""
    core = new_core(hash_fn=parent_blind_hash)
    core.events.drain()
    h5 = parent_blind_hash(ROOT, pack_tokens((5, 5, 5, 5)))
    h2 = parent_blind_hash(ROOT, pack_tokens((2, 2, 2, 2)))
    h7 = parent_blind_hash(ROOT, pack_tokens((7, 7, 7, 7)))
    step(core, "e", AllocateOp("s1", (5, 5, 5, 5, 2, 2, 2, 2, 0)),
         AppendOp("s1", num_computed_tokens=4))
    core.reset_prefix_cache()
    # s1 keeps hashing onto its dropped first entry: its block 1 is stored, but unreachable.
    step(core, "e", AppendOp("s1", num_computed_tokens=8))
    assert core.events.drain() == [stored(2, 0, h5, ROOT, (5, 5, 5, 5)),
                                   reset(3, "prefix_cache_reset"),
                                   stored(4, 1, h2, h5, (2, 2, 2, 2))]

    # s2 computes 2 2 2 2 as a first block: same hash, other prefix, and the owner of the hash
    # can never be hit again. The index gives the hash to s2's block.
    result = step(core, "e", AllocateOp("s2", (2, 2, 2, 2, 9)),
                  AppendOp("s2", num_computed_tokens=4))
    assert result.results[0].block_table == [3, 4]
    assert core.events.drain() == [removed(5, 1, h2), stored(6, 3, h2, ROOT, (2, 2, 2, 2))]

    # s3's second block collides with s2's entry, which is reachable: the index keeps it and
    # nothing is reported for s3's block.
    step(core, "e", AllocateOp("s3", (7, 7, 7, 7, 2, 2, 2, 2, 0)),
         AppendOp("s3", num_computed_tokens=8))
    assert core.events.drain() == [stored(7, 5, h7, ROOT, (7, 7, 7, 7))]
    assert {h: b.block_id for h, b in core.executors["e"].pool.blocks.index_entries()} == {
        h2: 3, h7: 5}


def test_events_of_the_collision_scenario_rebuild_the_index():
    core = new_core(hash_fn=parent_blind_hash)
    mirror = IndexMirror()
    step(core, "e", AllocateOp("s1", (5, 5, 5, 5, 2, 2, 2, 2, 0)),
         AppendOp("s1", num_computed_tokens=4))
    core.reset_prefix_cache()
    step(core, "e", AppendOp("s1", num_computed_tokens=8))
    step(core, "e", AllocateOp("s2", (2, 2, 2, 2, 9)), AppendOp("s2", num_computed_tokens=4))
    step(core, "e", AllocateOp("s3", (7, 7, 7, 7, 2, 2, 2, 2, 0)),
         AppendOp("s3", num_computed_tokens=8))
    mirror.apply(core.events.drain())
    mirror.check(core)


# -- property: the stream rebuilds every index -----------------------------------------------------

class EventMirrorMixin:
    """Adds to the stateful machine of test_allocator_stateful a reader of the event stream
    that must hold every pool's exact index after every rule."""

    def __init__(self) -> None:
        super().__init__()
        self.mirror = IndexMirror()
        self.stored_since_registration: dict[str, set[bytes]] = {}

    @invariant()
    def event_stream_rebuilds_every_index(self) -> None:
        events = self.allocator.events.drain()
        for event in events:
            if event.type is RESET and event.reason == PoolResetReason.REGISTERED:
                self.stored_since_registration[event.executor_id] = set()
            elif event.type is STORED:
                # The hash is recomputable from the event, and its parent is a root or a hash
                # this pool stored before (a router can follow the chain).
                assert self.hash_fn(event.parent_hash, pack_tokens(event.token_ids)) == event.block_hash
                known = self.stored_since_registration[event.executor_id]
                roots = {root_hash("model", salt) for salt in ("", "tenant")}
                assert event.parent_hash in roots | known
                known.add(event.block_hash)
        self.mirror.apply(events)
        assert self.mirror.last_seq == self.allocator.events.last_seq
        self.mirror.check(self.allocator)


class MirroredMachine(EventMirrorMixin, AllocatorMachine):
    pass


class MirroredWeakHashMachine(EventMirrorMixin, WeakHashAllocatorMachine):
    pass


MIRROR_SETTINGS = settings(max_examples=30, stateful_step_count=40, deadline=None)
TestEventStreamRebuildsEveryIndex = MirroredMachine.TestCase
TestEventStreamRebuildsEveryIndex.settings = MIRROR_SETTINGS
TestEventStreamRebuildsEveryIndexWithCollidingHash = MirroredWeakHashMachine.TestCase
TestEventStreamRebuildsEveryIndexWithCollidingHash.settings = MIRROR_SETTINGS


# -- the packed form ------------------------------------------------------------------------------

executor_ids = st.sampled_from(["e", "gpu-0", "", 'tricky "id"\n', "é" * 40, "x" * 300])
hashes = st.binary(min_size=0, max_size=32)
one_event = st.one_of(
    st.builds(lambda executor, block, h, parent, tokens: (STORED, executor, block, h, parent,
                                                          tuple(tokens)),
              executor_ids, st.integers(0, 2**31 - 1), hashes, hashes,
              st.lists(st.integers(0, 2**31 - 1), max_size=40)),
    st.builds(lambda executor, block, h: (REMOVED, executor, block, h),
              executor_ids, st.integers(0, 2**31 - 1), hashes),
    st.builds(lambda executor, reason, num_blocks, block_size: (RESET, executor, reason,
                                                                num_blocks, block_size),
              executor_ids, st.sampled_from(list(PoolResetReason)), st.integers(0, 2**40),
              st.integers(0, 2**20)))


def numbered(first: int, drawn: list[tuple]) -> list[KvEvent]:
    events = []
    for seq, (type_, executor, *fields) in enumerate(drawn, start=first):
        if type_ == STORED:
            events.append(stored(seq, *fields, executor_id=executor))
        elif type_ == REMOVED:
            events.append(removed(seq, *fields, executor_id=executor))
        else:
            events.append(reset(seq, str(fields[0]), *fields[1:], executor_id=executor))
    return events


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 2**40), st.lists(one_event, max_size=30))
def test_packed_events_read_back_as_written(first: int, drawn: list[tuple]):
    events = numbered(first, drawn)
    packed = pack(events)
    assert len(packed) == len(events)
    assert unpack(packed) == events
    assert [record[0] for record in records(packed)] == [event.seq for event in events]


def test_the_core_packs_what_it_numbers_and_readers_refuse_damaged_batches():
    core = new_core()
    assert [event.reason for event in unpack(core.events.take())] == ["registered"]
    step(core, "e", AllocateOp("a", tuple(range(9))), AppendOp("a", (), 0, 9))
    packed = core.events.take()
    assert (packed.first_seq, packed.count) == (2, 2)
    assert [event.type for event in unpack(packed)] == [STORED, STORED]
    assert core.events.take() == NO_EVENTS and not core.events.take()
    with pytest.raises(ValueError, match="3 were counted"):
        records(PackedEvents(packed.first_seq, 3, packed.data))
    with pytest.raises(ValueError, match="unknown record type 9"):
        records(PackedEvents(1, 1, bytes([9])))


# -- MemoryStore.read_events -----------------------------------------------------------------------

def commit_events(store: MemoryStore, first: int, last: int) -> None:
    store.commit(Allocator(), Command("step", b""),
                 pack([KvEvent(seq, STORED, "e", block_id=seq) for seq in range(first, last + 1)]))


def seqs(events: list[KvEvent]) -> list[int]:
    return [event.seq for event in events]


def test_read_events_from_seq_and_limit():
    store = MemoryStore()
    assert store.read_events(0, 10, 0) == []
    commit_events(store, 1, 3)
    commit_events(store, 4, 4)
    store.commit(Allocator(), Command("reset", b""), NO_EVENTS)  # a change without events
    commit_events(store, 5, 7)
    assert seqs(store.read_events(0, 100, 0)) == [1, 2, 3, 4, 5, 6, 7]
    assert seqs(store.read_events(1, 100, 0)) == [1, 2, 3, 4, 5, 6, 7]
    assert seqs(store.read_events(5, 100, 0)) == [5, 6, 7]
    assert seqs(store.read_events(7, 100, 0)) == [7]
    assert store.read_events(8, 100, 0) == []
    assert store.read_events(50, 100, 0) == []
    assert seqs(store.read_events(0, 3, 0)) == [1, 2, 3]
    assert seqs(store.read_events(3, 2, 0)) == [3, 4]
    assert seqs(store.read_events(6, 5, 0)) == [6, 7]
    assert store.read_events(2, 0, 0) == []
    # What comes back are the committed events themselves.
    assert store.read_events(4, 1, 0)[0] == KvEvent(4, STORED, "e", block_id=4)


def test_read_events_ring_drops_the_oldest():
    store = MemoryStore(max_events=5)
    commit_events(store, 1, 3)
    commit_events(store, 4, 8)
    assert seqs(store.read_events(0, 100, 0)) == [4, 5, 6, 7, 8]
    # From a dropped seq: the reading starts at the oldest kept.
    assert seqs(store.read_events(2, 100, 0)) == [4, 5, 6, 7, 8]
    assert seqs(store.read_events(2, 2, 0)) == [4, 5]
    assert seqs(store.read_events(6, 100, 0)) == [6, 7, 8]
    assert store.read_events(9, 100, 0) == []
    commit_events(store, 9, 20)  # more than the ring holds in one commit
    assert seqs(store.read_events(0, 100, 0)) == [16, 17, 18, 19, 20]
    assert seqs(store.read_events(18, 100, 0)) == [18, 19, 20]
    commit_events(store, 21, 22)  # the ring now ends part way into the commit before
    assert seqs(store.read_events(0, 100, 0)) == [18, 19, 20, 21, 22]
    assert seqs(store.read_events(17, 2, 0)) == [18, 19]
    assert seqs(store.read_events(21, 100, 0)) == [21, 22]


def test_read_events_waits_for_a_commit_from_another_thread():
    store = MemoryStore()
    commit_events(store, 1, 2)
    started = threading.Event()

    def commit_later() -> None:
        started.set()
        time.sleep(0.2)
        commit_events(store, 3, 3)

    writer = threading.Thread(target=commit_later)
    begin = time.monotonic()
    writer.start()
    started.wait()
    events = store.read_events(3, 10, wait_s=10.0)
    elapsed = time.monotonic() - begin
    writer.join()
    assert seqs(events) == [3]
    assert 0.15 <= elapsed < 5.0


def test_read_events_with_events_ready_does_not_wait_and_without_any_waits_wait_s():
    store = MemoryStore()
    begin = time.monotonic()
    assert store.read_events(1, 10, wait_s=0.2) == []
    assert time.monotonic() - begin >= 0.18
    commit_events(store, 1, 1)
    begin = time.monotonic()
    assert seqs(store.read_events(1, 10, wait_s=10.0)) == [1]
    assert time.monotonic() - begin < 1.0


def test_events_committed_through_the_state_gate_reach_readers_in_order():
    store = MemoryStore()
    state = AllocatorState(Allocator(), store)
    with state.writing() as core:
        core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
        state.commit(commands.register(pb.RegisterExecutorRequest(executor_id="e")))
    with state.writing() as core:
        step(core, "e", AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10))
        state.commit(commands.step(b""))
    events = store.read_events(0, 100, 0)
    assert [(e.seq, e.type) for e in events] == [(1, RESET), (2, STORED), (3, STORED)]
    mirror = IndexMirror()
    mirror.apply(events)
    mirror.check(state.core)


def test_read_events_finds_every_event_after_a_change_that_raised_halfway():
    """The state gate drops the events of a change that raised before its commit (their seq
    numbers are used up), so the ring can hold a gap; reading from a seq after it must still
    start at that seq."""
    store = MemoryStore()
    state = AllocatorState(Allocator(), store)
    with state.writing() as core:
        core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")  # event 1
        state.commit(commands.register(pb.RegisterExecutorRequest(executor_id="e")))
    try:
        with state.writing() as core:
            core.reset_prefix_cache("e")  # event 2, dropped
            raise RuntimeError("the change failed before its commit")
    except RuntimeError:
        pass
    with state.writing() as core:
        step(core, "e", AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10))  # events 3, 4
        state.commit(commands.step(b""))
    assert seqs(store.read_events(0, 100, 0)) == [1, 3, 4]
    assert seqs(store.read_events(3, 100, 0)) == [3, 4]
    assert seqs(store.read_events(4, 100, 0)) == [4]
