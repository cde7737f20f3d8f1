"""An executor paused (SIGSTOP) past its allocator lease while it streams through the gateway,
then resumed (SIGCONT): alive all along, but silent for longer than its lease.

The allocator reclaims its pool when the lease lapses. The gateway routes nothing new to it
(with no other executor, a new request is refused with UNAVAILABLE at once) but keeps its
Session for the requests it runs. Resumed, the executor finds its pool gone, re-registers under
a newer epoch and recomputes those requests, so every stream still ends with the undisturbed
greedy answer, and no block leaks.
"""
from __future__ import annotations

import os
import signal
import time
from contextlib import closing

import grpc
import pytest

from pagedserve.allocator.v1 import allocator_pb2_grpc as apb_grpc
from pagedserve.supervisor.service_process import (AllocatorProcess, ExecutorProcess,
                                                   GatewayProcess, pagedctl_audit)
from tests.support.allocator_wire import used_blocks
from tests.support.drill_load import Load, describe, listed, matches, prompts, undisturbed, warm_up
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(240)
LEASE_TTL_S = 3.0
MAX_TOKENS = 64


def test_streams_of_an_executor_paused_past_its_lease_finish_after_it_resumes(tmp_path):
    cache = tmp_path / "cache"
    load_prompts = prompts("pause", 6)
    with AllocatorProcess("--lease-ttl", str(LEASE_TTL_S)) as allocator, \
            ExecutorProcess("--allocator", allocator.target, "--executor-id", "sleepy",
                            "--num-blocks", "256",
                            env={"PAGEDSERVE_CACHE_DIR": str(cache)}) as executor, \
            GatewayProcess("--allocator", allocator.target, "--refresh-s", "0.2") as gateway, \
            closing(Load(gateway.target, gateway.http_url, MAX_TOKENS)) as load:
        admin = apb_grpc.AllocatorAdminStub(allocator.channel())
        warm_up(executor)
        epoch = listed(admin)["sleepy"]
        streams = load.start_all(load_prompts)
        assert all(stream.first_token.wait(120) for stream in streams)
        os.kill(executor.pid, signal.SIGSTOP)
        try:
            # A stream may end between its first token and the pause, or on what the executor
            # sent just before it: the ones still open a moment later must stay open.
            time.sleep(1.0)
            paused = [stream for stream in streams if not stream.done.is_set()]
            assert paused
            wait_for(lambda: "sleepy" not in listed(admin), timeout_s=LEASE_TTL_S + 10)
            wait_for(lambda: load.client.list_models() == [], timeout_s=10)
            with pytest.raises(grpc.RpcError) as refused:
                load.client.complete(load_prompts[0], max_tokens=4)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "no executor is ready" in refused.value.details()
            assert not any(stream.done.is_set() for stream in paused)
        finally:
            os.kill(executor.pid, signal.SIGCONT)

        load.wait()
        expected = undisturbed(cache, load_prompts, MAX_TOKENS)
        assert all(map(matches, streams, expected)), describe(streams, expected)
        assert listed(admin)["sleepy"] > epoch
        assert "re-registering" in executor.stderr_tail()
        assert "no longer registered with the allocator" in gateway.stderr_tail()
        wait_for(lambda: used_blocks(allocator) == 0)
        audit = pagedctl_audit(allocator)
        assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
