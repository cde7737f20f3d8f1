"""An executor killed with SIGKILL under load, with a second executor of the same model beside
it, through a real gateway (gRPC and HTTP streams) and an allocator with a 5 s lease.

The gateway notices at once (the Session stream breaks): a request that had already streamed
tokens from the dead executor ends with UNAVAILABLE naming it (gRPC status; an error event on an
HTTP stream), one that had not is resubmitted to the survivor and ends as if nothing happened,
and new requests go to the survivor. The allocator reclaims the dead pool when its lease lapses.
The executor restarted under the same id registers with a newer epoch, and the gateway routes to
it again. No block leaks anywhere.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import grpc
import pytest

from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.allocator.v1 import allocator_pb2_grpc as apb_grpc
from pagedserve.executor.v1 import executor_pb2 as epb
from pagedserve.executor.v1 import executor_pb2_grpc as epb_grpc
from pagedserve.supervisor.service_process import (AllocatorProcess, ExecutorProcess,
                                                   GatewayProcess, pagedctl_audit)
from tests.support.allocator_wire import used_blocks
from tests.support.drill_load import (Load, Recorded, describe, listed, matches, prompts,
                                      undisturbed, warm_up)
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(240)
STREAMS = 12
MAX_NUM_SEQS = 4   # so each executor holds some requests waiting, with no token streamed yet
# Short, so the dead pool goes soon, yet well above the longest gap between a live executor's
# calls to the allocator on a busy 2-core machine (over 2 s seen): only the victim's may lapse.
LEASE_TTL_S = 5.0
# Long enough that no running stream ends while the queued ones are placed: with sparse Steps
# a quiet machine decoded 64 tokens before the four were, and the count it waits on fell.
MAX_TOKENS = 512


def start_executor(allocator: AllocatorProcess, executor_id: str, cache) -> ExecutorProcess:
    return ExecutorProcess("--allocator", allocator.target, "--executor-id", executor_id,
                           "--num-blocks", "256", "--max-num-seqs", str(MAX_NUM_SEQS),
                           env={"PAGEDSERVE_CACHE_DIR": str(cache)})


def info(executor: ExecutorProcess) -> epb.ExecutorInfo:
    return epb_grpc.ExecutorStub(executor.channel()).GetInfo(epb.GetInfoRequest(), timeout=5)


def start_placed(load: Load, prompt: list[int], index: int,
                 executors: dict[str, ExecutorProcess]) -> Recorded:
    """Starts the index-th stream (every third over HTTP) and waits until an executor has it."""
    stream = load.start(prompt, "http" if index % 3 == 2 else "grpc")
    wait_for(lambda: sum(i.num_running + i.num_waiting
                         for i in map(info, executors.values())) == index + 1, timeout_s=60)
    return stream


def holders(admin: apb_grpc.AllocatorAdminStub) -> dict[str, str]:
    """Gateway request id -> the executor whose pool holds its sequence."""
    return {s.seq_id.split("#")[0]: s.executor_id
            for s in admin.ListSequences(apb.ListSequencesRequest(), timeout=5).sequences}


def test_executor_kill_9_mid_stream_with_two_executors(tmp_path):
    cache = tmp_path / "cache"
    load_prompts, later_prompts = prompts("exec", STREAMS), prompts("later", 2)
    with ExitStack() as started:   # stops the ones started if a later one fails to
        allocator = started.enter_context(AllocatorProcess("--lease-ttl", str(LEASE_TTL_S)))
        executors = {eid: started.enter_context(start_executor(allocator, eid, cache))
                     for eid in ("exec-a", "exec-b")}
        gateway = started.enter_context(GatewayProcess("--allocator", allocator.target,
                                                       "--refresh-s", "0.2"))
        started.pop_all()
    load = Load(gateway.target, gateway.http_url, MAX_TOKENS)
    admin = apb_grpc.AllocatorAdminStub(allocator.channel())
    try:
        for executor in executors.values():
            warm_up(executor)
        wait_for(lambda: load.client.list_models()[0].num_executors == 2, timeout_s=30)
        epochs = listed(admin)
        # One request at a time, each placed before the next, so the gateway spreads them by
        # load: each executor runs MAX_NUM_SEQS, every one streaming, and queues two more.
        running = [start_placed(load, prompt, i, executors)
                   for i, prompt in enumerate(load_prompts[:2 * MAX_NUM_SEQS])]
        assert all(stream.first_token.wait(120) for stream in running)
        queued = [start_placed(load, prompt, i, executors)
                  for i, prompt in enumerate(load_prompts[2 * MAX_NUM_SEQS:], len(running))]
        placement = holders(admin)
        apis = {eid: {s.api for s in running if placement.get(s.request_id) == eid}
                for eid in executors}
        victim_id = next(eid for eid in sorted(executors) if apis[eid] == {"grpc", "http"})
        survivor_id = next(eid for eid in executors if eid != victim_id)
        victim_info = info(executors[victim_id])
        assert (victim_info.num_running, victim_info.num_waiting) == (
            MAX_NUM_SEQS, len(queued) // 2)
        doomed = [s for s in running if placement.get(s.request_id) == victim_id]
        assert len(doomed) == MAX_NUM_SEQS

        victim = executors[victim_id]
        victim.process.kill()
        victim.process.wait()
        victim.stop()
        # New requests go to the survivor: none meets the dead link (no resubmission, below).
        load.start(later_prompts[0], "grpc")
        load.start(later_prompts[1], "http")

        # The dead pool stays until its lease lapses, then it is reclaimed whole.
        wait_for(lambda: victim_id not in listed(admin), timeout_s=LEASE_TTL_S + 10)
        load.wait()
        expected = dict(zip(map(tuple, load_prompts + later_prompts),
                            undisturbed(cache, load_prompts + later_prompts, MAX_TOKENS)))
        failed = [s for s in load.streams if not matches(s, expected[tuple(s.prompt)])]
        assert failed == doomed, describe(load.streams, [expected[tuple(s.prompt)]
                                                         for s in load.streams])
        for stream in doomed:
            reference = expected[tuple(stream.prompt)]
            assert stream.text and reference.text.startswith(stream.text)
            assert reference.token_ids[:len(stream.token_ids)] == stream.token_ids
            assert victim_id in stream.error, stream.error
            if stream.api == "grpc":
                assert stream.status == grpc.StatusCode.UNAVAILABLE, stream
                assert stream.token_ids
        # The requests that had streamed nothing went to the survivor, once each.
        assert gateway.stderr_tail(500).count("; resubmitting") == victim_info.num_waiting
        wait_for(lambda: used_blocks(allocator) == 0)
        assert list(listed(admin)) == [survivor_id]

        # Back under the same id: a newer epoch than any before, and routed to again.
        executors[victim_id] = start_executor(allocator, victim_id, cache)
        warm_up(executors[victim_id])
        assert listed(admin)[victim_id] > max(epochs.values())
        assert info(executors[victim_id]).epoch == listed(admin)[victim_id]
        wait_for(lambda: load.client.list_models()[0].num_executors == 2, timeout_s=60)
        served = {eid: info(executor).num_steps for eid, executor in executors.items()}
        for round_ in range(5):   # short requests, 4 at a time, until both have served one
            with ThreadPoolExecutor(4) as pool:
                finishes = list(pool.map(
                    lambda prompt: load.client.complete(prompt, max_tokens=8, temperature=0,
                                                        ignore_eos=True).finish_reasons,
                    prompts(f"round {round_}", 4)))
            assert finishes == [["length"]] * 4
            if all(info(executor).num_steps > served[eid]
                   for eid, executor in executors.items()):
                break
        else:
            pytest.fail("the restarted executor was never routed to")
        wait_for(lambda: used_blocks(allocator) == 0)
        audit = pagedctl_audit(allocator)
        assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
    finally:
        load.close()
        for process in (gateway, *executors.values(), allocator):
            process.stop()
