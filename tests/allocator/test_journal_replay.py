"""The journal: every change is committed as one command, and replaying the commands in order
rebuilds exactly the state (and the KV events) of the core that executed them the first time.

The servicers are called in-process (context=None), over an AllocatorState whose MemoryStore
records what is committed.
"""
from __future__ import annotations

import json

import pytest

from allocator_service.core.allocator import Allocator
from allocator_service.core.audit import audit_pool
from allocator_service.core.errors import (ExecutorIndexTaken, StaleEpoch, StepIdReused,
                                           UnknownExecutor)
from allocator_service.core.kv_events import KvEvent, PackedEvents, unpack
from allocator_service.durability import commands, snapshot
from allocator_service.durability.commands import Command, CorruptJournal
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import MemoryStore
from allocator_service.server.admin_servicer import AllocatorAdminServicer
from allocator_service.server.allocator_servicer import AllocatorServicer
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.errors import InvalidArgument, Unavailable
from pagedserve.protocol.block_codec import op_to_proto
from pagedserve.protocol.block_ops import (AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp, InvalidOp,
                                           StepResult)
from tests.allocator.test_snapshot import restored
from tests.support.allocator_core import A10, core_state


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingStore(MemoryStore):
    """The in-memory store, keeping every commit for the test to look at."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[Command, list[KvEvent]]] = []

    def commit(self, core: Allocator, command: Command, events: PackedEvents) -> None:
        self.commits.append((command, unpack(events)))
        super().commit(core, command, events)

    @property
    def commands(self) -> list[Command]:
        return [command for command, _ in self.commits]


class RefusingStore(RecordingStore):
    def refusal(self) -> str:
        return "the store is down (test)"


def registration(executor_id: str, num_blocks: int = 11, block_size: int = 4
                 ) -> pb.RegisterExecutorRequest:
    return pb.RegisterExecutorRequest(executor_id=executor_id, address=f"{executor_id}:1",
                                      num_blocks=num_blocks, block_size=block_size,
                                      model_fingerprint="m")


def step_request(executor_id: str, epoch: int, step_id: int, *ops: BlockOp) -> pb.StepRequest:
    return pb.StepRequest(executor_id=executor_id, epoch=epoch, step_id=step_id,
                          ops=[op_to_proto(op) for op in ops])


def step_body(executor_id: str, epoch: int, step_id: int, *ops: BlockOp) -> bytes:
    return step_request(executor_id, epoch, step_id, *ops).SerializeToString(deterministic=True)


class Server:
    """The two servicers over one core, as the allocator process wires them."""

    def __init__(self, store: RecordingStore | None = None, lease_ttl_s: float = 10.0) -> None:
        self.clock = FakeClock()
        self.core = Allocator(lease_ttl_s=lease_ttl_s, step_log_size=8, clock=self.clock)
        self.store = store or RecordingStore()
        self.state = AllocatorState(self.core, self.store)
        self.allocator = AllocatorServicer(self.state)
        self.admin = AllocatorAdminServicer(self.state)

    def register(self, executor_id: str, num_blocks: int = 11, block_size: int = 4) -> int:
        return self.allocator.RegisterExecutor(
            registration(executor_id, num_blocks, block_size), None).epoch

    def step(self, executor_id: str, epoch: int, step_id: int, *ops: BlockOp) -> pb.StepResponse:
        return self.allocator.Step(step_request(executor_id, epoch, step_id, *ops), None)


def replay(journal: list[Command], core: Allocator | None = None) -> Allocator:
    core = core or Allocator(step_log_size=8)
    for command in journal:
        commands.apply(core, command)
    return core


def run_session(server: Server) -> list[pb.StepResponse]:
    """A session with every kind of change: registrations and a restart, steps with prefix
    hits, copies, evictions and failing ops, retries, resets, and a lapsed lease."""
    responses = []
    e = server.register("e")
    f = server.register("f", 8, 2)
    responses.append(server.step("e", e, 1, AllocateOp("a", tuple(A10)),
                                 AppendOp("a", num_computed_tokens=10)))
    responses.append(server.step("e", e, 2, AllocateOp("b", tuple(A10[:8]) + (50, 51)),
                                 ForkOp("a", "a2"), AppendOp("a2", (10,)),
                                 FreeOp("ghost")))
    responses.append(server.step("e", e, 2, AllocateOp("b", tuple(A10[:8]) + (50, 51)),
                                 ForkOp("a", "a2"), AppendOp("a2", (10,)),
                                 FreeOp("ghost")))  # a retry: nothing journaled
    responses.append(server.step("f", f, 1, AllocateOp("x", (1, 2, 3, 4, 5), "t", 2),
                                 AppendOp("x", (6,), 0, 5)))
    # Frees all: cached 1 and 0 go to the tail; 10 blocks for big take 1 (evicted) too.
    responses.append(server.step("e", e, 3, FreeOp("a"), FreeOp("a2"), FreeOp("b"),
                                 AllocateOp("big", tuple(range(100, 140)))))
    server.admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(executor_id="f"), None)
    responses.append(server.step("f", f, 2, AppendOp("x", (7,), 0, 7), ForkOp("x", "x2"),
                                 AllocateOp("y", tuple(range(40)))))  # too large
    f = server.register("f", 6, 3)  # a restart: a new, empty pool
    responses.append(server.step("f", f, 1, AllocateOp("x", (1, 2, 3, 4, 5, 6, 7)),
                                 AppendOp("x", (), 0, 7)))
    server.admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(), None)
    # e's lease lapses while f heartbeats.
    server.clock.now += 6
    server.allocator.Heartbeat(pb.HeartbeatRequest(executor_id="f", epoch=f), None)
    server.clock.now += 6
    assert server.state.reclaim_expired() == ["e"]
    responses.append(server.step("f", f, 2, AllocateOp("z", (1, 2, 3, 4, 5, 6, 9)),
                                 FreeOp("x")))
    e = server.register("e", 5, 4)
    responses.append(server.step("e", e, 1, AllocateOp("a", tuple(A10))))
    return responses


# -- replay rebuilds the first run exactly -------------------------------------------------------

def test_replaying_the_committed_journal_rebuilds_the_same_state_and_events():
    server = Server()
    run_session(server)
    journal = server.store.commands
    assert [command.kind for command in journal] == [
        "register", "register", "step", "step", "step", "step", "reset", "step", "register",
        "step", "reset", "reclaim", "step", "register", "step"]

    core = Allocator(step_log_size=8)
    for command, events in server.store.commits:
        commands.apply(core, command)
        # Each command causes on replay exactly the events it was committed with.
        assert core.events.drain() == events, command
    assert core_state(core) == core_state(server.core)
    assert snapshot.capture(core) == snapshot.capture(server.core)
    for executor_id, executor in core.executors.items():
        assert audit_pool(executor_id, executor.pool) == []


def test_a_retry_on_the_replayed_core_gets_the_recorded_result():
    server = Server()
    responses = run_session(server)
    replayed = Server()
    replay(server.store.commands, replayed.core)

    # The last step of e, and an older step of f, retried byte for byte.
    again = replayed.step("e", 4, 1, AllocateOp("a", tuple(A10)))
    assert again.replayed
    again.replayed = False
    assert again == responses[-1]
    again = replayed.step("f", 3, 1, AllocateOp("x", (1, 2, 3, 4, 5, 6, 7)),
                          AppendOp("x", (), 0, 7))
    assert again.replayed
    assert list(again.results) == list(responses[6].results)
    # Retries commit nothing; other ops under a recorded id are refused as on the first core.
    assert replayed.store.commits == []
    with pytest.raises(StepIdReused):
        replayed.step("e", 4, 1, AllocateOp("b", tuple(A10)))
    with pytest.raises(StepIdReused):
        server.step("e", 4, 1, AllocateOp("b", tuple(A10)))


def test_hand_built_commands_replay_like_the_direct_calls():
    first = Allocator()
    journal = []

    def register(executor_id: str, num_blocks: int, block_size: int) -> None:
        request = registration(executor_id, num_blocks, block_size)
        first.register_executor(executor_id, request.address, num_blocks, block_size, "m")
        journal.append(commands.register(request))

    def step(executor_id: str, epoch: int, step_id: int, *ops: BlockOp) -> StepResult:
        body = step_body(executor_id, epoch, step_id, *ops)
        journal.append(commands.step(body))
        return first.step(executor_id, epoch, step_id, list(ops), commands.step_digest(body))

    register("e", 11, 4)
    register("f", 4, 2)
    step("e", 1, 1, AllocateOp("a", tuple(A10), lookahead_slots=3),
         AppendOp("a", num_computed_tokens=10))
    step("e", 1, 2, AllocateOp("b", tuple(A10)), ForkOp("b", "c"), AppendOp("c", (1,), 0, 8))
    step("f", 2, 5, AllocateOp("x", (9, 9, 9)), AppendOp("x", (9,), 0, 4))
    first.reset_prefix_cache("e")
    journal.append(commands.reset(pb.ResetPrefixCacheRequest(executor_id="e")))
    first.reclaim([("f", 2), ("e", 99)])
    journal.append(commands.reclaim([("f", 2), ("e", 99)]))
    last = step("e", 1, 3, FreeOp("a"), AllocateOp("d", tuple(A10)))

    core = replay(journal)
    assert core.events.drain() == first.events.drain()
    assert core_state(core) == core_state(first)
    # The step record is there: the same request (same digest) is answered, not applied.
    body = step_body("e", 1, 3, FreeOp("a"), AllocateOp("d", tuple(A10)))
    ops = [FreeOp("a"), AllocateOp("d", tuple(A10))]
    answer = core.step("e", 1, 3, ops, commands.step_digest(body))
    assert answer == StepResult(last.results, last.num_free_blocks, replayed=True)
    assert core_state(core) == core_state(first)


def test_snapshot_then_the_rest_of_the_journal_rebuilds_the_same_state():
    """How a durable store loads: the last snapshot, then the commands after it."""
    server = Server()
    run_session(server)
    journal = server.store.commands
    for split in range(len(journal) + 1):
        head = replay(journal[:split])
        head.events.drain()
        core = Allocator(step_log_size=8)
        snapshot.restore(core, json.loads(json.dumps(snapshot.capture(head))))
        replay(journal[split:], core)
        assert core_state(core) == core_state(server.core), split


def test_pools_reclaimed_together_replay_in_the_journaled_order():
    server = Server()
    server.register("z")
    server.register("a")
    server.clock.now += 11
    assert server.state.reclaim_expired() == ["z", "a"]
    command, events = server.store.commits[-1]
    assert command == commands.reclaim([("z", 1), ("a", 2)])
    assert [(ev.seq, ev.executor_id) for ev in events] == [(3, "z"), (4, "a")]
    core = replay(server.store.commands[:-1])
    core.events.drain()
    commands.apply(core, command)
    assert core.events.drain() == events


def test_reclaim_journal_body_is_json_pairs():
    command = commands.reclaim([("e", 3), ("f", 1)])
    assert command == Command("reclaim", b'[["e", 3], ["f", 1]]')


# -- corrupt journals ----------------------------------------------------------------------------

def registered_core() -> Allocator:
    return replay([commands.register(registration("e"))])


@pytest.mark.parametrize("command, message", [
    (Command("snapshot", b"{}"), "unknown command kind 'snapshot'"),
    (Command("", b""), "unknown command kind ''"),
    (commands.step(step_body("ghost", 1, 1, AllocateOp("a", (1,)))), "ghost"),
    (commands.step(step_body("e", 2, 1, AllocateOp("a", (1,)))), "epoch"),
    (commands.step(step_body("e", 1, 1, AllocateOp("a", ()))), "token_ids is empty"),
    (commands.step(b"\xff\xff\xff"), "step does not apply"),
    (commands.step(b"garbage"), "step does not apply"),
    (Command("register", b"\n\x05ab"), "register does not apply"),
    (commands.register(registration("f", num_blocks=0)), "num_blocks"),
    (Command("reset", b"\xff"), "reset does not apply"),
    (commands.reset(pb.ResetPrefixCacheRequest(executor_id="ghost")), "ghost"),
    (Command("reclaim", b"not json"), "reclaim does not apply"),
    (Command("reclaim", b'[["e"]]'), "reclaim does not apply"),
])
def test_corrupt_commands_are_refused(command, message):
    core = registered_core()
    with pytest.raises(CorruptJournal, match=message):
        commands.apply(core, command)


def test_the_same_step_journaled_twice_is_refused():
    body = step_body("e", 1, 1, AllocateOp("a", tuple(A10)))
    core = replay([commands.register(registration("e")), commands.step(body)])
    before = core_state(core)
    with pytest.raises(CorruptJournal, match="journaled twice"):
        commands.apply(core, commands.step(body))
    assert core_state(core) == before


def test_a_step_out_of_order_or_with_other_ops_under_a_journaled_id_is_refused():
    core = replay([commands.register(registration("e")),
                   commands.step(step_body("e", 1, 1, AllocateOp("a", (1,)))),
                   commands.step(step_body("e", 1, 2, AllocateOp("b", (1,))))])
    with pytest.raises(CorruptJournal, match="different ops"):
        commands.apply(core, commands.step(step_body("e", 1, 2, AllocateOp("c", (1,)))))
    with pytest.raises(CorruptJournal, match="step_id must be at least 1"):
        commands.apply(core, commands.step(step_body("e", 1, 0, AllocateOp("c", (1,)))))


def test_a_step_for_a_pool_whose_registration_is_missing_is_refused():
    journal = [commands.register(registration("e")),
               commands.step(step_body("e", 1, 1, AllocateOp("a", (1,)))),
               commands.register(registration("e")),
               commands.step(step_body("e", 2, 1, AllocateOp("a", (1,))))]
    replay(journal)  # complete: applies
    with pytest.raises(CorruptJournal, match="epoch"):
        replay(journal[:2] + journal[3:])  # the restart is missing
    with pytest.raises(CorruptJournal, match="not registered"):
        replay(journal[1:])


# -- what the servicers commit -------------------------------------------------------------------

def test_every_change_commits_exactly_one_command_with_its_events():
    server = Server()
    store = server.store

    request = registration("e")
    epoch = server.allocator.RegisterExecutor(request, None).epoch
    assert store.commands == [Command("register", request.SerializeToString(deterministic=True))]
    (_, events), = store.commits
    assert [(ev.seq, ev.type.name, ev.reason) for ev in events] == [(1, "POOL_RESET",
                                                                       "registered")]

    request = step_request("e", epoch, 1, AllocateOp("a", tuple(A10)),
                           AppendOp("a", num_computed_tokens=9))
    server.allocator.Step(request, None)
    assert store.commands[1:] == [Command("step", request.SerializeToString(deterministic=True))]
    assert [(ev.seq, ev.type.name) for ev in store.commits[1][1]] == [(2, "BLOCK_STORED"),
                                                                       (3, "BLOCK_STORED")]

    request = pb.ResetPrefixCacheRequest(executor_id="e")
    assert server.admin.ResetPrefixCache(request, None).num_entries_dropped == 2
    assert store.commands[2:] == [commands.reset(request)]
    assert [(ev.seq, ev.reason) for ev in store.commits[2][1]] == [(4, "prefix_cache_reset")]

    server.clock.now += 11
    assert server.state.reclaim_expired() == ["e"]
    assert store.commands[3:] == [commands.reclaim([("e", epoch)])]
    assert [(ev.seq, ev.reason) for ev in store.commits[3][1]] == [(5, "lease_expired")]
    # Nothing else is due: no empty reclaim is committed.
    assert server.state.reclaim_expired() == []
    assert len(store.commits) == 4
    assert server.core.events.num_pending == 0


def test_reads_and_heartbeats_commit_nothing():
    server = Server()
    epoch = server.register("e")
    server.step("e", epoch, 1, AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10))
    before = (len(server.store.commits), core_state(server.core))

    server.allocator.Heartbeat(pb.HeartbeatRequest(executor_id="e", epoch=epoch,
                                                   num_waiting=2, num_running=1), None)
    assert server.allocator.MatchPrefix(pb.MatchPrefixRequest(token_ids=A10), None
                                        ).executors[0].num_cached_tokens == 8
    server.admin.GetStats(pb.GetStatsRequest(), None)
    server.admin.ListExecutors(pb.ListExecutorsRequest(), None)
    server.admin.ListSequences(pb.ListSequencesRequest(), None)
    server.admin.GetBlockTable(pb.GetBlockTableRequest(seq_id="a"), None)
    server.admin.DumpBlocks(pb.DumpBlocksRequest(executor_id="e"), None)
    assert list(server.admin.Audit(pb.AuditRequest(), None).violations) == []
    assert (len(server.store.commits), core_state(server.core)) == before
    assert server.core.events.num_pending == 0


def test_a_retried_step_commits_nothing():
    server = Server()
    epoch = server.register("e")
    first = server.step("e", epoch, 1, AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10))
    committed = len(server.store.commits)
    again = server.step("e", epoch, 1, AllocateOp("a", tuple(A10)), AppendOp("a", (), 0, 10))
    assert again.replayed and list(again.results) == list(first.results)
    assert len(server.store.commits) == committed
    assert server.core.events.num_pending == 0


@pytest.mark.parametrize("ops, error", [
    ([AllocateOp("a", tuple(A10)), AllocateOp("b", ())], InvalidOp),
    ([AllocateOp("a", tuple(A10)), AppendOp("a", num_computed_tokens=-1)], InvalidOp),
    ([AllocateOp("a", tuple(A10)), ForkOp("a", "a")], InvalidOp),
    ([AllocateOp("a", tuple(A10)), AllocateOp("b", (-5,))], InvalidOp),
    ([AllocateOp("a", tuple(A10)), AppendOp("a", lookahead_slots=1 << 20)], InvalidOp),
])
def test_a_malformed_step_commits_nothing_and_leaves_no_events(ops, error):
    server = Server()
    epoch = server.register("e")
    # A cached prefix, so that the allocate of the refused step would emit events if applied.
    server.step("e", epoch, 1, AllocateOp("p", tuple(A10)), AppendOp("p", (), 0, 10))
    before = (len(server.store.commits), core_state(server.core))
    with pytest.raises(error):
        server.step("e", epoch, 2, *ops)
    assert (len(server.store.commits), core_state(server.core)) == before
    assert server.core.events.num_pending == 0


def test_steps_refused_before_applying_commit_nothing():
    server = Server()
    epoch = server.register("e")
    committed = len(server.store.commits)
    no_kind = pb.StepRequest(executor_id="e", epoch=epoch, step_id=1, ops=[pb.BlockOp()])
    with pytest.raises(InvalidOp, match="sets no kind"):
        server.allocator.Step(no_kind, None)
    with pytest.raises(InvalidOp, match="step_id"):
        server.step("e", epoch, 0, AllocateOp("a", (1,)))
    with pytest.raises(StaleEpoch):
        server.step("e", epoch + 1, 1, AllocateOp("a", (1,)))
    with pytest.raises(UnknownExecutor):
        server.step("ghost", epoch, 1, AllocateOp("a", (1,)))
    with pytest.raises(InvalidArgument):
        server.register("", 4, 4)
    with pytest.raises(UnknownExecutor):
        server.admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(executor_id="ghost"), None)
    assert len(server.store.commits) == committed
    assert server.core.events.num_pending == 0
    assert server.core.executors["e"].last_step_id == 0


def test_a_change_that_raises_halfway_leaves_no_events_for_the_next_commit():
    server = Server()
    server.register("e")
    with pytest.raises(RuntimeError):
        with server.state.writing() as core:
            core.reset_prefix_cache("e")  # emits a PoolReset
            raise RuntimeError("failed before commit")
    assert server.core.events.num_pending == 0
    epoch = server.core.executors["e"].epoch
    server.step("e", epoch, 1, AllocateOp("a", (1,)))
    assert server.store.commits[-1][1] == []


def test_a_refusing_store_refuses_changes_before_they_apply():
    server = Server(RefusingStore())
    with pytest.raises(Unavailable, match="down"):
        server.register("e")
    with pytest.raises(Unavailable):
        server.admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(), None)
    assert server.state.reclaim_expired() == []
    assert (server.core.executors, server.core.last_epoch, server.core.events.last_seq) == (
        {}, 0, 0)
    assert server.store.commits == []


def test_executor_indexes_survive_the_journal_and_a_snapshot_and_still_refuse_a_duplicate():
    """A duplicate is refused by the allocator that recovered, as by the one that served."""
    server = Server()
    numbered = registration("gpu0")
    numbered.executor_index = 0
    server.allocator.RegisterExecutor(numbered, None)
    server.register("plain")
    duplicate = registration("copy")
    duplicate.executor_index = 0
    with pytest.raises(ExecutorIndexTaken, match="index 0, which executor 'gpu0' holds"):
        server.allocator.RegisterExecutor(duplicate, None)
    journal = server.store.commands
    assert [command.kind for command in journal] == ["register", "register"]  # not the refusal

    for recovered in (replay(journal), restored(replay(journal), step_log_size=8)):
        assert {eid: ex.executor_index for eid, ex in recovered.executors.items()} == {
            "gpu0": 0, "plain": None}
        with pytest.raises(ExecutorIndexTaken):
            recovered.register_executor("copy", "copy:1", 11, 4, "m", executor_index=0)


def test_a_snapshot_from_before_executor_indexes_restores_them_as_none():
    core = replay([commands.register(registration("e"))])
    data = snapshot.capture(core)
    for item in data["executors"]:
        del item["executor_index"]
    again = Allocator(step_log_size=8)
    snapshot.restore(again, data)
    assert again.executors["e"].executor_index is None
