"""An executor keeps its lease while its engine computes for longer than the lease: the lease
keeper renews it from its own thread, so only a dead or frozen executor loses its pool."""
from __future__ import annotations

import time

import pytest

from executor_service.allocator_client import RemoteBlockAllocator
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(60)
LEASE_S = 1.0


def epochs(admin: pb_grpc.AllocatorAdminStub) -> dict[str, int]:
    return {executor.executor_id: executor.epoch for executor in
            admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors}


def test_a_silent_engine_keeps_its_pool_until_its_client_closes():
    with AllocatorProcess("--lease-ttl", str(LEASE_S)) as allocator:
        admin = pb_grpc.AllocatorAdminStub(allocator.channel())
        client = RemoteBlockAllocator(allocator.target, "busy", "127.0.0.1:1")
        epoch = client.register(num_blocks=8, block_size=4, model_fingerprint="m")
        # The engine makes no call for 3.5 leases, as in one long iteration.
        time.sleep(3.5 * LEASE_S)
        assert epochs(admin) == {"busy": epoch}
        client.close()   # the process is gone: its lease lapses
        wait_for(lambda: epochs(admin) == {}, timeout_s=5 * LEASE_S)
