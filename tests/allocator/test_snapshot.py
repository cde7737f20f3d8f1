"""Snapshots: capture() writes the whole core as JSON-able data, restore() rebuilds it exactly.

Exact ids on pools of 11 blocks of 4 slots (see tests/support/allocator_core.py for the free list
order behind them). "Exactly" is checked with allocator_core.core_state, which reads the objects
themselves, not through snapshot.py, and by running the same next ops on the original and the
restored core.
"""
from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from allocator_service.core.allocator import Allocator
from allocator_service.core.audit import audit_pool
from allocator_service.core.block_hash import (chain_hash, hash_packed, pack_tokens, root_hash,
                                               unpack_tokens)
from allocator_service.core.errors import StepIdReused
from allocator_service.core.inspection import BlockState, block_views
from allocator_service.durability import snapshot
from pagedserve.protocol.block_ops import (AllocateOp, AppendOp, ForkOp, FreeOp, OpResult, OpStatus,
                                           StepResult)
from tests.allocator.test_allocator_stateful import (LEASE_TTL, STEP_LOG_SIZE, AllocatorMachine,
                                                     WeakHashAllocatorMachine)
from tests.support.allocator_core import (A10, BLOCK_SIZE, NUM_BLOCKS, core_state, free_ids, step,
                                          step_digest_of, weak_hash)


def restored(core: Allocator, **kwargs) -> Allocator:
    """A fresh core loaded from core's snapshot, after a trip through JSON text."""
    data = snapshot.capture(core)
    again = Allocator(**kwargs)
    snapshot.restore(again, json.loads(json.dumps(data)))
    return again


def assert_same_state(original: Allocator, copy_: Allocator) -> None:
    assert core_state(copy_) == core_state(original)
    for executor_id, executor in copy_.executors.items():
        assert audit_pool(executor_id, executor.pool) == []
    assert snapshot.capture(copy_) == snapshot.capture(original)


def busy_core() -> Allocator:
    """Two pools with everything a snapshot has to carry.

    Pool e (11 blocks of 4): a and b share the cached prefix 0, 1; a2 is a fork of a (shares
    0, 1, 2); d reserved 6 slots ahead; c was computed and freed, so its blocks 5 and 4 are
    cached-free at the tail, 5 to be evicted first. Free list: 9, 10, 5, 4.
    Pool f (8 blocks of 2, salt "t"): its prefix cache was reset while y was live; y then cached
    one more block, chained onto a dropped identity.
    """
    core = Allocator()
    core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    core.register_executor("f", "f:1", 8, 2, "m")
    step(core, "e", AllocateOp("a", tuple(A10)), AppendOp("a", num_computed_tokens=10))
    assert step(core, "e", AllocateOp("b", tuple(A10[:8] + [50, 51, 52]))).results == [
        OpResult(block_table=[0, 1, 3], num_cached_tokens=8)]
    step(core, "e", AllocateOp("c", (*range(100, 108), 7)), AppendOp("c", num_computed_tokens=9))
    assert step(core, "e", FreeOp("c"), ForkOp("a", "a2"),
                AllocateOp("d", (200, 201, 202), lookahead_slots=6)).results == [
        OpResult(), OpResult(block_table=[0, 1, 2]), OpResult(block_table=[6, 7, 8])]
    step(core, "f", AllocateOp("x", (1, 2, 3, 4, 5), "t"), AppendOp("x", num_computed_tokens=5))
    assert step(core, "f", AllocateOp("y", (1, 2, 3, 4, 9), "t"), FreeOp("x")).results == [
        OpResult(block_table=[0, 1, 3], num_cached_tokens=4), OpResult()]
    assert core.reset_prefix_cache("f") == 2
    step(core, "f", AppendOp("y", (7,), num_computed_tokens=6))
    core.events.drain()
    return core


# -- exact contents --------------------------------------------------------------------------------

def test_empty_core_round_trips():
    core = Allocator()
    data = snapshot.capture(core)
    assert data == {"version": snapshot.FORMAT_VERSION, "last_epoch": 0, "last_event_seq": 0,
                    "executors": []}
    again = restored(core)
    assert again.executors == {}
    assert (again.last_epoch, again.events.last_seq) == (0, 0)


def test_core_after_reclaim_keeps_its_epoch_and_event_counters():
    core = Allocator()
    core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    assert core.reclaim([("e", 2)]) == ["e"]
    again = restored(core)
    assert (again.executors, again.last_epoch, again.events.last_seq) == ({}, 2, 3)
    # The next registration continues both counters.
    assert again.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m").epoch == 3
    (event,) = again.events.drain()
    assert event.seq == 4


def test_busy_core_restores_every_block_sequence_and_counter():
    core = busy_core()
    again = restored(core)
    assert_same_state(core, again)

    e, f = again.executors["e"], again.executors["f"]
    pool = e.pool
    assert (e.epoch, f.epoch, again.last_epoch, again.events.last_seq) == (1, 2, 2, 10)
    assert (e.address, e.model_fingerprint, e.last_step_id, f.last_step_id) == ("e:1", "m", 4, 3)
    assert free_ids(pool) == [9, 10, 5, 4]
    assert pool.num_free_blocks == 4
    views = {v.block_id: v for v in block_views(pool)}
    assert [views[i].state for i in range(NUM_BLOCKS)] == (
        [BlockState.USED] * 4 + [BlockState.CACHED_FREE] * 2 + [BlockState.USED] * 3
        + [BlockState.FREE] * 2)
    assert [views[i].ref_count for i in range(NUM_BLOCKS)] == [3, 3, 2, 1, 0, 0, 1, 1, 1, 0, 0]
    assert [views[i].num_tokens for i in range(NUM_BLOCKS)] == [4, 4, 2, 3, 0, 0, 3, 0, 0, 0, 0]

    root = root_hash("m", "")
    h0 = chain_hash(root, (0, 1, 2, 3))
    h1 = chain_hash(h0, (4, 5, 6, 7))
    c0 = chain_hash(root, (100, 101, 102, 103))
    c1 = chain_hash(c0, (104, 105, 106, 107))
    assert {h: (b.block_id, b.parent_hash, b.token_ids, b.node_id, b.parent_key)
            for h, b in pool.blocks.index_entries()} == {
        h0: (0, root, (0, 1, 2, 3), 1, ""), h1: (1, h0, (4, 5, 6, 7), 2, 1),
        c0: (4, root, (100, 101, 102, 103), 3, ""), c1: (5, c0, (104, 105, 106, 107), 4, 3)}
    assert pool.blocks.last_node_id == 4
    assert (pool.prefix_query_tokens, pool.prefix_hit_tokens) == (33, 8)

    seqs = pool.sequences
    assert list(seqs) == ["a", "b", "a2", "d"]
    a, b, a2, d = (seqs[s] for s in ("a", "b", "a2", "d"))
    assert (a.block_ids(), a.num_tokens, a.unhashed_token_ids.tolist(), a.num_cached_tokens,
            a.num_computed_tokens, a.num_hashed_blocks, a.chain_hash, a.chain_key) == (
        [0, 1, 2], 10, A10[8:], 0, 10, 2, h1, 2)
    assert (b.block_ids(), b.num_cached_tokens, b.num_computed_tokens, b.num_hashed_blocks,
            b.chain_hash, b.chain_key) == ([0, 1, 3], 8, 8, 2, h1, 2)
    assert (a2.block_ids(), a2.num_tokens, a2.unhashed_token_ids.tolist(),
            a2.num_computed_tokens, a2.chain_key) == ([0, 1, 2], 10, A10[8:], 10, 2)
    assert (d.block_ids(), d.num_tokens, d.unhashed_token_ids.tolist(), d.num_computed_tokens,
            d.num_hashed_blocks, d.chain_hash, d.chain_key, d.cache_salt) == (
        [6, 7, 8], 3, [200, 201, 202], 0, 0, root, "", "")
    # Every restored table entry is a block of the restored pool.
    assert all(0 <= block < pool.num_blocks for seq in seqs.values() for block in seq.block_table)

    # Pool f: the reset dropped nodes 1 and 2; y chained block 3 onto node 2 afterwards.
    fpool = f.pool
    troot = root_hash("m", "t")
    y0 = chain_hash(troot, (1, 2))
    y1 = chain_hash(y0, (3, 4))
    y2 = chain_hash(y1, (9, 7))
    assert {h: (b.block_id, b.parent_hash, b.token_ids, b.node_id, b.parent_key)
            for h, b in fpool.blocks.index_entries()} == {y2: (3, y1, (9, 7), 3, 2)}
    assert fpool.blocks.last_node_id == 3
    assert free_ids(fpool) == [2, 4, 5, 6, 7]
    (y,) = fpool.sequences.values()
    assert (y.seq_id, y.cache_salt, y.block_ids(), y.num_tokens, y.unhashed_token_ids.tolist(),
            y.num_cached_tokens, y.num_computed_tokens, y.num_hashed_blocks, y.chain_hash,
            y.chain_key) == ("y", "t", [0, 1, 3], 6, [], 4, 6, 3, y2, 3)
    assert (fpool.prefix_query_tokens, fpool.prefix_hit_tokens) == (10, 4)


def test_step_records_are_restored_and_answer_retries():
    core = busy_core()
    again = restored(core)
    e = again.executors["e"]
    assert list(e.step_log) == [1, 2, 3, 4]
    assert e.step_log[4].result == StepResult(
        [OpResult(), OpResult(block_table=[0, 1, 2]), OpResult(block_table=[6, 7, 8])], 4)
    ops = [FreeOp("c"), ForkOp("a", "a2"), AllocateOp("d", (200, 201, 202), lookahead_slots=6)]
    retry = again.step("e", 1, 4, ops, step_digest_of("e", 1, 4, ops))
    assert retry == StepResult(core.executors["e"].step_log[4].result.results, 4, replayed=True)
    # An older recorded step too; and another request under a recorded id is still refused.
    first = core.executors["e"].step_log[2].result
    ops2 = [AllocateOp("b", tuple(A10[:8] + [50, 51, 52]))]
    assert again.step("e", 1, 2, ops2, step_digest_of("e", 1, 2, ops2)).results == first.results
    with pytest.raises(StepIdReused):
        again.step("e", 1, 2, ops2, b"another request")
    assert_same_state(core, again)  # retries change nothing


def test_step_log_keeps_only_the_configured_number_of_records():
    core = Allocator(step_log_size=2)
    core.register_executor("e", "e:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    for n in range(5):
        step(core, "e", AllocateOp(f"s{n}", (n,)))
    again = restored(core, step_log_size=2)
    assert list(again.executors["e"].step_log) == [4, 5]
    assert again.executors["e"].last_step_id == 5
    assert_same_state(core, again)


def test_snapshot_is_plain_json_and_survives_a_text_round_trip():
    data = snapshot.capture(busy_core())
    text = json.dumps(data)
    assert json.loads(text) == data

    # No tuples, bytes or other non-JSON values anywhere (they would not come back as such).
    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or type(value) in (str, int, float, bool)

    assert plain(data)


def test_capture_is_a_deep_copy_later_changes_to_the_core_do_not_reach_it():
    core = busy_core()
    data = snapshot.capture(core)
    frozen = copy.deepcopy(data)
    step(core, "e", AppendOp("a", (10, 11, 12), num_computed_tokens=10), FreeOp("b"),
         AllocateOp("g", (5, 5, 5, 5, 5)))
    core.reset_prefix_cache()
    assert data == frozen


def mutable_ids(value) -> set[int]:
    """ids of every list and dict inside value (a snapshot)."""
    if isinstance(value, dict):
        return {id(value)}.union(*(mutable_ids(v) for v in value.values()))
    if isinstance(value, list):
        return {id(value)}.union(*(mutable_ids(v) for v in value))
    return set()


def test_captured_snapshot_shares_no_mutable_object_with_the_core():
    """capture() promises a deep copy. Editing the snapshot (the Redis store encodes it in a
    background thread) must not be able to reach the core. Checked by identity, without
    mutating: a mutation would poison ops.OK, the result every plain Append returns."""
    core = busy_core()
    data = snapshot.capture(core)
    core_lists = {id(lst) for ex in core.executors.values() for rec in ex.step_log.values()
                  for r in rec.result.results for lst in (r.block_table, r.new_blocks, r.copies)}
    assert mutable_ids(data) & core_lists == set()


def test_idle_pool_of_100000_blocks_snapshots_to_a_few_hundred_bytes():
    core = Allocator()
    core.register_executor("big", "big:1", 100_000, 16, "m")
    data = snapshot.capture(core)
    encoded = json.dumps(data)
    assert len(encoded) < 1024
    assert data["executors"][0]["pool"]["free_list"] == [[0, 100_000]]
    again = restored(core)
    assert free_ids(again.executors["big"].pool) == list(range(100_000))
    assert_same_state(core, again)


def test_free_list_is_stored_as_runs_in_lru_order():
    core = busy_core()
    pool_data = snapshot.capture(core)["executors"][0]["pool"]
    assert pool_data["free_list"] == [[9, 2], [5, 1], [4, 1]]
    assert free_ids(restored(core).executors["e"].pool) == [9, 10, 5, 4]


def test_restore_refuses_another_format_version():
    data = snapshot.capture(busy_core())
    data["version"] = 99
    with pytest.raises(ValueError) as info:
        snapshot.restore(Allocator(), data)
    message = str(info.value)
    assert re.search(r"\b99\b", message) and re.search(rf"\b{snapshot.FORMAT_VERSION}\b",
                                                       message), message


def test_tokens_are_written_packed_and_format_1_and_2_snapshots_still_restore():
    """Format 3 writes a sequence's tokens after its hashed blocks, packed (4 bytes each,
    little-endian) as hex. Format 2, which allocators before it wrote, had every token of a
    sequence, and format 1 had them as lists of ints: both restore to the same core."""
    core = busy_core()
    data = snapshot.capture(core)
    pool = data["executors"][0]["pool"]
    cached = next(block for block in pool["blocks"] if len(block) > 2)
    assert (cached[0], cached[4]) == (0, "00000000" "01000000" "02000000" "03000000")
    sequence = next(seq for seq in pool["sequences"] if seq["seq_id"] == "a")
    assert (sequence["num_tokens"], bytes.fromhex(sequence["unhashed_token_ids"])) == (
        10, pack_tokens(A10[8:]))

    # Every token of busy_core's live sequences, as format 2 saved them.
    every_token = {"a": A10, "a2": A10, "b": A10[:8] + [50, 51, 52], "d": [200, 201, 202],
                   "y": [1, 2, 3, 4, 9, 7]}
    format_2 = copy.deepcopy(data)
    format_2["version"] = 2
    for executor in format_2["executors"]:
        for seq in executor["pool"]["sequences"]:
            tokens = every_token[seq["seq_id"]]
            assert len(tokens) == seq.pop("num_tokens")
            del seq["unhashed_token_ids"]
            seq["token_ids"] = pack_tokens(tokens).hex()
    format_1 = copy.deepcopy(format_2)
    format_1["version"] = 1
    for executor in format_1["executors"]:
        for block in executor["pool"]["blocks"]:
            if len(block) > 2:
                block[4] = list(unpack_tokens(bytes.fromhex(block[4])))
        for seq in executor["pool"]["sequences"]:
            seq["token_ids"] = list(unpack_tokens(bytes.fromhex(seq["token_ids"])))
    for old in (format_2, format_1):
        again = Allocator()
        snapshot.restore(again, json.loads(json.dumps(old)))
        assert_same_state(core, again)


def test_restored_core_has_fresh_leases_and_reports_no_events_for_loading():
    clock = [100.0]
    core = busy_core()
    again = Allocator(lease_ttl_s=7, clock=lambda: clock[0])
    snapshot.restore(again, snapshot.capture(core))
    assert again.events.num_pending == 0
    assert {eid: ex.lease_expires_at for eid, ex in again.executors.items()} == {
        "e": 107.0, "f": 107.0}
    clock[0] = 107.0
    assert sorted(again.expire_leases()) == ["e", "f"]


# -- the restored core continues exactly like the original ----------------------------------------

def test_restored_core_continues_identically():
    core = busy_core()
    again = restored(core)
    next_ops = [
        # a2 writes into block 2 (shared with a): copied into block 9, the head of the free list.
        AppendOp("a2", (11,)),
        # A prefix-cache hit on the cached-free block 4 (c's first block), plus block 10.
        AllocateOp("h", (100, 101, 102, 103, 55)),
        # The last free block is 5: taking it evicts c's second block from the cache.
        AllocateOp("g", (300, 301, 302)),
        AllocateOp("i", (400,)),
    ]
    expected = StepResult([
        OpResult(copies=[(2, 9)]),
        OpResult(block_table=[4, 10], num_cached_tokens=4),
        OpResult(block_table=[5]),
        OpResult(status=OpStatus.OUT_OF_BLOCKS, message="out of blocks: 0 of 11 free"),
    ], 0)
    results = [step(c, "e", *next_ops) for c in (core, again)]
    assert results[0] == results[1] == expected
    # ... with the same KV events, numbered the same.
    events = [c.events.drain() for c in (core, again)]
    assert events[0] == events[1]
    c1 = chain_hash(chain_hash(root_hash("m", ""), (100, 101, 102, 103)), (104, 105, 106, 107))
    assert [(ev.seq, ev.type.name, ev.block_id, ev.block_hash) for ev in events[0]] == [
        (11, "BLOCK_REMOVED", 5, c1)]

    # Freeing everything caches the same blocks at the same places of the free list; pool f
    # continues too (its reset entries stay dropped: no hit for x's old prompt).
    more = [step(c, "e", *(FreeOp(s) for s in ("a", "b", "a2", "d", "h", "g"))) for c in
            (core, again)]
    assert more[0] == more[1]
    f_ops = [AllocateOp("z", (1, 2, 3, 4, 9, 7, 8), "t"), AppendOp("y", (8,), 0, 7)]
    f_results = [step(c, "f", *f_ops) for c in (core, again)]
    assert f_results[0] == f_results[1]
    assert f_results[0].results[0].num_cached_tokens == 0
    assert core.match_prefix(A10 + [99], "") == again.match_prefix(A10 + [99], "")
    assert core.events.drain() == again.events.drain()
    assert_same_state(core, again)


# -- property: restoring at any point changes nothing that follows --------------------------------

PROMPT_PREFIXES = ((), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6, 7, 8), (7, 7, 7, 7, 7, 7, 7, 7, 7))
EXECUTORS = st.sampled_from(["e0", "e1"])
# again: the prompt starts with a live sequence's tokens instead (a prefix hit when computed).
ALLOCATE = st.tuples(st.just("allocate"), EXECUTORS, st.integers(0, 7),
                     st.sampled_from(PROMPT_PREFIXES), st.lists(st.integers(0, 9), max_size=4),
                     st.sampled_from(["", "t"]), st.integers(0, 3), st.booleans())
# The last number is how many tokens to report computed (capped at the sequence's length).
APPEND = st.tuples(st.just("append"), EXECUTORS, st.integers(0, 7),
                   st.lists(st.integers(0, 9), max_size=3), st.integers(0, 3), st.integers(0, 20))
FORK = st.tuples(st.just("fork"), EXECUTORS, st.integers(0, 7), st.integers(0, 7))
# The boolean: the sequence finished, so it reports every token computed before it is freed.
FREE = st.tuples(st.just("free"), EXECUTORS, st.integers(0, 7), st.booleans())
RESET = st.tuples(st.just("reset"), st.sampled_from(["", "e0", "e1"]))
REGISTER = st.tuples(st.just("register"), EXECUTORS, st.integers(6, 10), st.integers(2, 4))
RECLAIM = st.tuples(st.just("reclaim"), EXECUTORS)
# Weighted: mostly block operations, now and then a pool reset, restarted or reclaimed.
ACTIONS = st.sampled_from([ALLOCATE] * 8 + [APPEND] * 6 + [FORK] * 2 + [FREE] * 2
                          + [RESET, REGISTER, RECLAIM]).flatmap(lambda action: action)


def pick(seqs, index: int):
    return sorted(seqs)[index % len(seqs)] if seqs else "nobody"


def known_tokens(pool, seq) -> tuple[int, ...]:
    """A sequence's leading tokens as the core still holds them (it keeps none of those it
    hashed): its hashed blocks' cached tokens, up to the first that left the cache, and when
    none did, the tokens after them."""
    tokens: list[int] = []
    for block_id in seq.block_table[:seq.num_hashed_blocks]:
        block = pool.blocks.block(block_id)
        if block.token_ids is None:
            return tuple(tokens)
        tokens += block.token_ids
    return (*tokens, *seq.unhashed_token_ids)


def run_action(core: Allocator, action: tuple):
    """Applies one action to the core; every pick depends only on the core's state, so two
    cores in the same state take the same ops."""
    kind, executor_id = action[0], action[1]
    if kind == "register":
        return core.register_executor(executor_id, f"{executor_id}:1", action[2], action[3],
                                      "m").epoch
    if kind == "reset":
        if executor_id and executor_id not in core.executors:
            return None
        return core.reset_prefix_cache(executor_id)
    if kind != "reclaim":  # a registered pool (one with sequences for append, fork, free)
        live = sorted(core.executors)
        busy = [eid for eid in live if core.executors[eid].pool.sequences]
        options = busy if kind in ("append", "fork", "free") and busy else live
        if options and executor_id not in options:
            executor_id = options[0]
    executor = core.executors.get(executor_id)
    if executor is None:
        return None
    if kind == "reclaim":
        return core.reclaim([(executor_id, executor.epoch)])
    seqs = executor.pool.sequences
    if kind == "allocate":
        _, _, n, prefix, tail, salt, lookahead, again = action
        if again and seqs:
            seq = seqs[pick(seqs, n)]
            prefix, salt = known_tokens(executor.pool, seq), seq.cache_salt
        ops = [AllocateOp(f"s{n}", tuple(prefix) + tuple(tail) or (0,), salt, lookahead)]
    elif kind == "append":
        _, _, n, tokens, lookahead, computed = action
        ops = [AppendOp(pick(seqs, n), tuple(tokens), lookahead, computed)]
    elif kind == "fork":
        ops = [ForkOp(pick(seqs, action[2]), f"s{action[3]}")]
        if ops[0].parent_seq_id == ops[0].child_seq_id:
            ops = [ForkOp(ops[0].parent_seq_id, f"k{action[3]}")]
    else:
        seq_id = pick(seqs, action[2])
        ops = [FreeOp(seq_id)]
        if action[3] and seq_id in seqs:  # finished: report every token computed first
            ops.insert(0, AppendOp(seq_id, num_computed_tokens=seqs[seq_id].num_tokens))
    return step(core, executor_id, *ops)


@settings(max_examples=50, deadline=None)
@given(actions=st.lists(ACTIONS, min_size=10, max_size=50), data=st.data(),
       hash_fn=st.sampled_from([hash_packed, weak_hash]))
def test_restore_at_any_point_then_same_ops_give_same_results_and_state(actions, data, hash_fn):
    """With the real hash, and with one that collides all the time (collision handling keeps
    node ids and unreachable entries that the snapshot must carry)."""
    original = Allocator(step_log_size=4, hash_fn=hash_fn)
    original.register_executor("e0", "e0:1", 8, 4, "m")
    original.register_executor("e1", "e1:1", 10, 2, "m")
    split = data.draw(st.integers(0, len(actions)), label="split")
    for action in actions[:split]:
        run_action(original, action)
    original.events.drain()
    copy_ = Allocator(step_log_size=4, hash_fn=hash_fn)
    snapshot.restore(copy_, json.loads(json.dumps(snapshot.capture(original))))
    assert_same_state(original, copy_)
    for action in actions[split:]:
        assert run_action(original, action) == run_action(copy_, action), action
        assert original.events.drain() == copy_.events.drain()
    assert_same_state(original, copy_)


# -- the stateful machine of test_allocator_stateful, restarting from a snapshot now and then -----

class DigestingAllocator:
    """An Allocator that identifies every step by a digest of its ops, as the server does by its
    request bytes (only steps identified so can be snapshotted). A wrapper, not a subclass: the
    core may be compiled (mypyc), and compiled classes cannot be subclassed."""

    def __init__(self, core: Allocator) -> None:
        object.__setattr__(self, "core", core)

    def step(self, executor_id, epoch, step_id, ops, digest=None):
        if digest is None:
            digest = step_digest_of(executor_id, epoch, step_id, ops)
        return self.core.step(executor_id, epoch, step_id, ops, digest)

    def __getattr__(self, name):
        return getattr(self.core, name)

    def __setattr__(self, name, value):
        setattr(self.core, name, value)


class RestartingMachineMixin:
    """The machine's core is replaced, at random points, by one restored from its snapshot;
    every check of the machine (the simulated KV memory included) then runs on the copy."""

    def __init__(self) -> None:
        super().__init__()
        self.allocator = self.new_core()
        self.restarts = 0

    def new_core(self) -> DigestingAllocator:
        return DigestingAllocator(Allocator(lease_ttl_s=LEASE_TTL, step_log_size=STEP_LOG_SIZE,
                                            clock=self.clock, hash_fn=self.hash_fn))

    @rule()
    def restart_from_snapshot(self) -> None:
        data = json.loads(json.dumps(snapshot.capture(self.allocator.core)))
        before = core_state(self.allocator.core)
        copy_ = self.new_core()
        snapshot.restore(copy_.core, data)
        assert core_state(copy_.core) == before
        assert snapshot.capture(copy_.core) == data
        self.allocator = copy_
        self.restarts += 1
        # A restored executor gets a fresh lease.
        for model in self.models.values():
            model.lease_expires_at = self.clock.now + LEASE_TTL


class RestartingMachine(RestartingMachineMixin, AllocatorMachine):
    pass


class RestartingWeakHashMachine(RestartingMachineMixin, WeakHashAllocatorMachine):
    pass


RESTART_SETTINGS = settings(max_examples=25, stateful_step_count=40, deadline=None)
TestRestartsFromSnapshotsKeepPoolsConsistent = RestartingMachine.TestCase
TestRestartsFromSnapshotsKeepPoolsConsistent.settings = RESTART_SETTINGS
TestRestartsFromSnapshotsWithCollidingHash = RestartingWeakHashMachine.TestCase
TestRestartsFromSnapshotsWithCollidingHash.settings = RESTART_SETTINGS
