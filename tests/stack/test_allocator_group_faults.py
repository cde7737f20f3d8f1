"""One shard of an allocator group killed with SIGKILL under load, through the gateway.

Two durable shards (one Redis, a namespace each), one executor registered with each, a gateway
that knows both. Greedy streams run on both executors; shard A is killed. Its executor's streams
run on into the slots granted ahead, then wait, resending their Steps; the other executor's
streams go on and finish while A is still down, its pool untouched (same epoch, nothing
reclaimed, a clean audit). The gateway keeps routing on the answers it gets, and keeps A's
executor as it was for as long as A is silent, longer than it keeps one an allocator stopped
listing. Shard A restarts on its namespace, and its executor's streams finish
with the tokens an undisturbed engine gives: nothing was lost on either side.
"""
from __future__ import annotations

import shutil
import time
from contextlib import ExitStack

import pytest

from gateway.executors.directory import UNLISTED_GRACE_S
from pagedserve.gateway_client import GatewayClient
from pagedserve.supervisor.redis_server import REDIS_SERVER
from pagedserve.supervisor.service_process import (AllocatorProcess, ExecutorProcess,
                                                   GatewayProcess, pagedctl_audit)
from tests.support.allocator_group import Shards
from tests.support.drill_load import Load, describe, matches, prompts, undisturbed
from tests.support.durability import kill_9
from tests.support.polling import wait_for

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which(REDIS_SERVER) is None,
                       reason="redis-server is not installed"),
]
STREAMS = 8
NAMESPACES = ("test:group:shard-0", "test:group:shard-1")


def test_killing_one_shard_loses_nothing_and_leaves_the_other_shards_pools_alone(
        redis_server, tmp_path):
    cache = tmp_path / "cache"
    env = {"PAGEDSERVE_CACHE_DIR": str(cache)}
    durable = ("--state-url", redis_server.url)
    shards = Shards.start(2, *durable, shard_args=[("--state-namespace", namespace)
                                                   for namespace in NAMESPACES])
    with ExitStack() as started:
        started.callback(lambda: shards.stop())
        on_a, on_b = shards.executor_ids("exec")
        for executor_id in (on_a, on_b):
            started.enter_context(ExecutorProcess(
                "--allocator", shards.target, "--executor-id", executor_id, "--num-blocks",
                "256", env=env))
        gateway = started.enter_context(GatewayProcess(
            "--allocator", shards.target, "--refresh-s", "0.2"))
        assert shards.epochs(0).keys() == {on_a} and shards.epochs(1).keys() == {on_b}, \
            "each executor registered with its own shard only"
        load = Load(gateway.target, gateway.http_url)
        started.callback(load.close)
        with GatewayClient(gateway.target) as client:
            wait_for(lambda: client.list_models()[0].num_executors == 2, timeout_s=30)

        streams = [load.start(prompt) for prompt in prompts("group", STREAMS)]
        assert all(stream.first_token.wait(120) for stream in streams)
        running = shards.sequences()
        assert set(running) == {on_a, on_b}, f"the load went to one executor only: {running}"
        on_b_streams = [s for s in streams if f"{s.request_id}#0" in running[on_b]]
        on_a_streams = [s for s in streams if s not in on_b_streams]
        epoch_a, epoch_b = shards.epochs(0), shards.epochs(1)

        a_port = shards.processes[0].port
        kill_9(shards.processes[0])
        killed_at = time.monotonic()
        load.start(prompts("during", 1)[0])   # routed on what the gateway knows
        # The other shard's executor finishes its streams while A is still down.
        for stream in on_b_streams:
            assert stream.done.wait(120), "a stream on the surviving shard stalled"
        assert not any(stream.done.is_set() for stream in on_a_streams), \
            "a stream finished while its shard was down"
        assert shards.epochs(1) == epoch_b, "the surviving shard's pool was not re-registered"
        survivor = Shards([shards.processes[1]])
        wait_for(lambda: survivor.used_blocks() == 0, timeout_s=120)
        audit = pagedctl_audit(survivor)
        assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
        survivor.client.close()
        # Longer than the gateway lets an executor its allocator stopped listing keep its
        # link: a shard that does not answer is not one that stopped listing.
        time.sleep(max(0.0, killed_at + UNLISTED_GRACE_S + 1 - time.monotonic()))
        with GatewayClient(gateway.target) as client:
            assert client.list_models()[0].num_executors == 2, "A's executor was kept"

        restarted = AllocatorProcess(*durable, "--state-namespace", NAMESPACES[0],
                                     "--port", str(a_port))
        back = time.monotonic()
        shards.processes[0] = restarted
        load.wait()
        assert all(stream.ended_at > back for stream in on_a_streams)
        assert min(stream.ended_at for stream in on_b_streams) > killed_at
        expected = undisturbed(cache, [stream.prompt for stream in load.streams])
        assert all(map(matches, load.streams, expected)), describe(load.streams, expected)
        # A's pool came back from its own namespace under the same epoch; the group is clean.
        assert shards.epochs(0) == epoch_a
        wait_for(lambda: shards.used_blocks() == 0)
        audit = pagedctl_audit(shards)
        assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
