"""The allocator's outages seen through the gateway under load: the allocator killed with
SIGKILL and restarted on its Redis, and its Redis killed and restarted. A dozen greedy streams
(gRPC and HTTP) run through a real gateway, executor, durable allocator and redis-server.

In both drills the executor rides out the gap: decoding goes on into the blocks already
granted, then its Steps are resent with the same step id and backoff until the allocator
answers again. So every stream ends with the tokens an undisturbed engine gives, and a request
that arrives during the outage is accepted and served once it is over (it waits rather than
failing, as docs/executor.md says); only changes to the allocator's state are refused
meanwhile, with UNAVAILABLE naming what is down. Afterwards `Audit` is clean, no block is used,
and the state a restarted allocator loads from Redis equals the one it had in memory.
"""
from __future__ import annotations

import shutil
import time
from contextlib import ExitStack

import grpc
import pytest

from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.executor.v1 import executor_pb2 as epb
from pagedserve.executor.v1 import executor_pb2_grpc as epb_grpc
from pagedserve.supervisor.redis_server import REDIS_SERVER, RedisProcess
from pagedserve.supervisor.service_process import (AllocatorProcess, ExecutorProcess,
                                                   GatewayProcess, pagedctl_audit)
from tests.support.allocator_wire import used_blocks
from tests.support.drill_load import Load, describe, matches, prompts, undisturbed
from tests.support.durability import (assert_audit_clean, cached_blocks, kill_9, not_serving,
                                      observed_state, redis_events, replay, serving, stubs)
from tests.support.polling import wait_for, wait_timed

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which(REDIS_SERVER) is None,
                       reason="redis-server is not installed"),
]
STREAMS = 12


def start_stack(redis_server: RedisProcess, cache
                ) -> tuple[AllocatorProcess, ExecutorProcess, GatewayProcess]:
    """A durable allocator, an executor and a gateway; the caller stops them (the allocator
    may be replaced on the way)."""
    with ExitStack() as started:   # stops the ones started if a later one fails to
        allocator = started.enter_context(AllocatorProcess("--state-url", redis_server.url))
        executor = started.enter_context(ExecutorProcess(
            "--allocator", allocator.target, "--num-blocks", "256",
            env={"PAGEDSERVE_CACHE_DIR": str(cache)}))
        gateway = started.enter_context(GatewayProcess(
            "--allocator", allocator.target, "--refresh-s", "0.2"))
        started.pop_all()
    return allocator, executor, gateway


def epoch_of(executor: ExecutorProcess) -> int:
    return epb_grpc.ExecutorStub(executor.channel()).GetInfo(epb.GetInfoRequest()).epoch


def assert_clean(allocator: AllocatorProcess) -> None:
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout


def test_allocator_kill_9_mid_stream_through_the_gateway(redis_server, tmp_path):
    cache = tmp_path / "cache"
    load_prompts, outage_prompts = prompts("kill", STREAMS), prompts("outage", 2)
    allocator, executor, gateway = start_stack(redis_server, cache)
    load = Load(gateway.target, gateway.http_url)
    try:
        epoch = epoch_of(executor)
        streams = load.start_all(load_prompts)
        assert all(stream.first_token.wait(120) for stream in streams)
        kill_9(allocator)
        during = [load.start(outage_prompts[0], "grpc"), load.start(outage_prompts[1], "http")]
        # The streams run on into the slots granted ahead, then wait; nothing ends meanwhile.
        time.sleep(1.5)
        assert not any(stream.done.is_set() for stream in load.streams)
        allocator = AllocatorProcess("--state-url", redis_server.url,
                                     "--port", str(allocator.port))
        back = time.monotonic()

        load.wait()
        expected = undisturbed(cache, load_prompts + outage_prompts)
        assert all(map(matches, load.streams, expected)), describe(load.streams, expected)
        assert all(stream.ended_at > back for stream in during)
        # The recovered pool carries on under the same epoch: no re-registration.
        assert epoch_of(executor) == epoch
        assert [e.epoch for e in stubs(allocator)[1].ListExecutors(
            apb.ListExecutorsRequest()).executors] == [epoch]
        assert_clean(allocator)
    finally:
        load.close()
        for process in (gateway, executor, allocator):
            process.stop()


def test_redis_kill_and_restart_under_load_through_the_gateway(redis_server, tmp_path):
    cache = tmp_path / "cache"
    load_prompts, outage_prompts = prompts("redis", STREAMS), prompts("outage", 2)
    allocator, executor, gateway = start_stack(redis_server, cache)
    load = Load(gateway.target, gateway.http_url)
    try:
        _, admin = stubs(allocator)
        health = allocator.channel()
        streams = load.start_all(load_prompts)
        assert all(stream.first_token.wait(120) for stream in streams)
        redis_server.kill()
        wait_timed(not_serving(health), 2, "allocator health NOT_SERVING")
        during = [load.start(outage_prompts[0], "grpc"), load.start(outage_prompts[1], "http")]
        time.sleep(1.5)
        # Changes are refused with a clear reason; reads answer; nothing ends; nobody died.
        with pytest.raises(grpc.RpcError) as refused:
            admin.ResetPrefixCache(apb.ResetPrefixCacheRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"state store {redis_server.url} is unavailable" in refused.value.details()
        assert used_blocks(allocator) > 0
        assert_audit_clean(admin)
        assert not any(stream.done.is_set() for stream in load.streams)
        assert all(p.process.poll() is None for p in (allocator, executor, gateway))
        assert "allocator unavailable (UNAVAILABLE); retrying step" in executor.stderr_tail()

        redis_server.restart()
        back = time.monotonic()
        wait_timed(serving(health), 10, "allocator health SERVING once Redis is back")
        load.wait()
        expected = undisturbed(cache, load_prompts + outage_prompts)
        assert all(map(matches, load.streams, expected)), describe(load.streams, expected)
        assert all(stream.ended_at > back for stream in during)
        assert_clean(allocator)

        # Redis holds what memory holds: its event stream replays to the prefix index, and an
        # allocator killed now loads exactly the state this one shows. (Once the executor's
        # heartbeat says it is idle: the load it reports lives in memory only, like the lease.)
        assert replay(redis_events(redis_server.client())) == cached_blocks(admin)
        wait_for(lambda: all(e.num_running == e.num_waiting == 0 for e in admin.ListExecutors(
            apb.ListExecutorsRequest(), timeout=5).executors))
        before = observed_state(admin)
        kill_9(allocator)
        allocator = AllocatorProcess("--state-url", redis_server.url,
                                     "--port", str(allocator.port))
        assert observed_state(stubs(allocator)[1]) == before
        # And the whole stack serves on.
        after = load.start(prompts("after", 1)[0])
        load.wait()
        (reference,) = undisturbed(cache, [after.prompt])
        assert matches(after, reference), describe([after], [reference])
    finally:
        load.close()
        for process in (gateway, executor, allocator):
            process.stop()
