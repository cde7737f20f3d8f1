"""Group commit: the Steps the Step channel read in one turn of its loop apply one after another
and are journaled in one Redis transaction (allocator_service/server/step_handler.py). Against a
real redis-server: each Step still answers alone, the batch is one MULTI/EXEC, a restart from
the journal rebuilds the same state, and when Redis is away every Step of the batch is refused,
kept, and written once it is back, where their retries get the recorded results. In memory,
where a commit is no round trip, each Step is answered before the next one applies."""
from __future__ import annotations

import shutil

import pytest

from allocator_service.core.allocator import Allocator
from allocator_service.durability import commands, snapshot
from allocator_service.durability.redis_store import RedisStore
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import MemoryStore
from allocator_service.server.step_handler import Outcome, decoded, handle_steps
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.errors import Unavailable
from pagedserve.protocol.block_codec import op_to_proto
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, FreeOp, StepResult
from pagedserve.protocol.step_frames import frame
from pagedserve.supervisor.redis_server import REDIS_SERVER, RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import allocate, append, fork, register
from tests.support.durability import assert_audit_clean, journal, kill_9, observed_state, stubs
from tests.support.step_channel import RawConnection

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which(REDIS_SERVER) is None, reason="redis-server is not installed"),
]

NAMESPACE = "group-commit-test"


def durable_state(url: str) -> AllocatorState:
    # The test's Redis fsyncs every write; under `pytest -n 2` beside tests that write to the
    # same disk, one fsync once took past a 2 s timeout (a commit refused, not what is tested).
    store = RedisStore(url, NAMESPACE, snapshot_every=10**9, timeout_s=10.0)
    state = AllocatorState(Allocator(), store)
    store.load(state.core)
    return state


def registered(state: AllocatorState, *executor_ids: str) -> dict[str, int]:
    """Registers each executor (one commit each); their epochs."""
    epochs = {}
    for executor_id in executor_ids:
        registration = pb.RegisterExecutorRequest(executor_id=executor_id,
                                                  address=f"{executor_id}:1", num_blocks=16,
                                                  block_size=4, model_fingerprint="m")
        with state.writing() as core:
            epochs[executor_id] = core.register_executor(
                registration.executor_id, registration.address, registration.num_blocks,
                registration.block_size, registration.model_fingerprint).epoch
            state.commit(commands.register(registration))
    return epochs


def request(executor_id: str, epoch: int, step_id: int, *ops) -> pb.StepRequest:
    return pb.StepRequest(executor_id=executor_id, epoch=epoch, step_id=step_id,
                          ops=[op_to_proto(op) for op in ops])


def outcomes_of(state: AllocatorState, batch: list[pb.StepRequest]) -> list[Outcome]:
    """handle_steps' answers, in the order it gave them (it gives each once, in order)."""
    answered: list[Outcome] = []

    def answer(index: int, outcome: Outcome) -> None:
        assert index == len(answered)
        answered.append(outcome)

    handle_steps(state, [decoded(r) for r in batch], answer)
    assert len(answered) == len(batch)
    return answered


def exec_calls(redis_server: RedisProcess) -> int:
    stats = redis_server.client().info("commandstats")
    return int(stats.get("cmdstat_exec", {}).get("calls", 0))


def test_steps_of_a_batch_answer_alone_and_are_journaled_in_one_transaction(
        redis_server: RedisProcess) -> None:
    state = durable_state(redis_server.url)
    epochs = registered(state, "a", "b")
    first = request("a", epochs["a"], 1, AllocateOp("s", (1, 2, 3, 4, 5)),
                    AppendOp("s", (), 0, 4))
    batch = [first,
             request("b", epochs["b"], 1, AllocateOp("t", (9,) * 8), AppendOp("t", (), 0, 8)),
             request("a", epochs["a"] + 1, 2, FreeOp("s")),   # a stale epoch: refused alone
             request("b", epochs["b"], 2, FreeOp("nobody")),  # an op that fails alone
             first,                                    # a retry: answered, not journaled
             request("a", epochs["a"], 2, AppendOp("s", (6, 7, 8, 9), 0, 0))]
    before = exec_calls(redis_server)
    outcomes = outcomes_of(state, batch)
    assert exec_calls(redis_server) == before + 1, "one MULTI/EXEC for the whole batch"

    assert isinstance(outcomes[2], Exception) and "epoch" in str(outcomes[2])
    answers = [o for o in outcomes if isinstance(o, StepResult)]
    assert len(answers) == 5
    assert list(outcomes[0].results[0].block_table) == [0, 1]
    assert (outcomes[4].replayed, outcomes[4].results) == (True, outcomes[0].results)
    assert outcomes[3].results[0].status == pb.OP_STATUS_NOT_FOUND
    assert list(outcomes[5].results[0].new_blocks) == [2]
    # Registrations 1-2, then the four Steps that applied, in the order they arrived.
    entries = journal(redis_server.client(), NAMESPACE)
    assert [seq for seq, _ in entries] == [1, 2, 3, 4, 5, 6]
    assert [kind for _, kind in entries] == ["register"] * 2 + ["step"] * 4

    # A fresh core loaded from the journal is the same core, KV events included.
    reloaded = durable_state(redis_server.url)
    assert snapshot.capture(reloaded.core) == snapshot.capture(state.core)
    assert reloaded.core.events.last_seq == state.core.events.last_seq
    state.store.close()
    reloaded.store.close()


def test_a_batch_redis_did_not_take_is_refused_whole_kept_and_written_when_it_is_back(
        redis_server: RedisProcess) -> None:
    state = durable_state(redis_server.url)
    epochs = registered(state, "a", "b")
    batch = [request("a", epochs["a"], 1, AllocateOp("s", (1, 2, 3, 4, 5))),
             request("b", epochs["b"], 1, AllocateOp("t", (7, 8))),
             request("a", epochs["a"], 2, AppendOp("s", (6,), 0, 6))]
    redis_server.kill()  # appendfsync always: what it acknowledged is on disk
    outcomes = outcomes_of(state, batch)
    assert all(isinstance(o, Unavailable) for o in outcomes)
    assert "did not take this change" in str(outcomes[0])
    # Refused from then on, before anything applies.
    (refused,) = outcomes_of(state, [request("a", epochs["a"], 3, FreeOp("s"))])
    assert isinstance(refused, Unavailable) and "is unavailable" in str(refused)

    redis_server.restart()
    assert state.store.probe()
    with state.lock:
        assert state.store.reconcile(state.core)
    assert [seq for seq, _ in journal(redis_server.client(), NAMESPACE)] == [1, 2, 3, 4, 5]
    # The executors retry: each gets what its Step did in memory, nothing applies twice.
    retried = outcomes_of(state, batch)
    assert [o.replayed for o in retried] == [True] * 3
    assert list(retried[0].results[0].block_table) == [0, 1]
    assert list(retried[2].results[0].new_blocks) == []
    reloaded = durable_state(redis_server.url)
    assert snapshot.capture(reloaded.core) == snapshot.capture(state.core)
    state.store.close()
    reloaded.store.close()


def applied_when_answered(state: AllocatorState, batch: list[pb.StepRequest]) -> list[int]:
    """For each Step of the batch as it is answered: how many Steps of the batch had applied."""
    seen: list[int] = []

    def answer(index: int, outcome: Outcome) -> None:
        assert isinstance(outcome, StepResult)
        with state.reading() as core:
            seen.append(sum(core.executors[r.executor_id].last_step_id >= r.step_id
                            for r in batch))

    handle_steps(state, [decoded(r) for r in batch], answer)
    return seen


def test_with_redis_a_batch_is_answered_after_its_commit_in_memory_each_step_at_once(
        redis_server: RedisProcess) -> None:
    durable = durable_state(redis_server.url)
    in_memory = AllocatorState(Allocator(), MemoryStore())
    for state in (durable, in_memory):
        epochs = registered(state, "a", "b", "c")
        batch = [request(executor_id, epochs[executor_id], 1, AllocateOp("s", (1, 2, 3)))
                 for executor_id in ("a", "b", "c")]
        seen = applied_when_answered(state, batch)
        assert seen == ([3, 3, 3] if state is durable else [1, 2, 3])
    durable.store.close()


def test_pipelined_steps_over_the_channel_survive_a_kill_9(
        redis_server: RedisProcess, durable_allocator) -> None:
    """One write of several Steps is one batch; what they did is in the journal before any
    answer goes out, so a kill -9 right after the answers loses none of it."""
    durable: AllocatorProcess = durable_allocator(redis_server.url)
    stub, admin = stubs(durable)
    executor = register(stub, "piped", num_blocks=16, block_size=4)
    connection = RawConnection(executor.step_channel_port)
    connection.hello(executor.executor_id)
    steps = [executor.request(1, allocate("a", list(range(10)), lookahead_slots=2)),
             executor.request(2, append("a", [10], num_computed_tokens=10)),
             executor.request(3, fork("a", "b")),
             executor.request(4, append("b", [12]))]
    connection.send(b"".join(frame(step.SerializeToString()) for step in steps))
    answers = [pb.StepResponse.FromString(connection.reply()) for _ in steps]
    assert list(answers[0].results[0].block_table) == [0, 1, 2]
    assert len(answers[3].results[0].copies) == 1   # b wrote into the block it shares with a
    assert_audit_clean(admin)
    before = observed_state(admin)

    kill_9(durable)
    recovered = durable_allocator(redis_server.url)
    _, admin = stubs(recovered)
    assert observed_state(admin) == before
    assert_audit_clean(admin)
