"""Executors' numbers (--executor-index) as the allocator holds them: a real executor registers
its number, and a second executor started with the same number does not start and says why."""
from __future__ import annotations

import pytest

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess, ExecutorProcess
from pagedserve.supervisor.supervised import ServiceStartError

pytestmark = pytest.mark.timeout(240)


def test_a_second_executor_with_the_same_index_stops_naming_the_holder(tmp_path):
    env = {"PAGEDSERVE_CACHE_DIR": str(tmp_path)}
    with AllocatorProcess() as allocator:
        with ExecutorProcess("--allocator", allocator.target, "--executor-id", "first",
                             "--executor-index", "4", "--num-blocks", "32", env=env):
            admin = pb_grpc.AllocatorAdminStub(allocator.channel())
            (listed,) = admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors
            assert (listed.executor_id, listed.executor_index) == ("first", 4)

            with pytest.raises(ServiceStartError) as refused:
                with ExecutorProcess("--allocator", allocator.target, "--executor-id", "second",
                                     "--executor-index", "4", "--num-blocks", "32", env=env):
                    pass
            assert ("executor 'second' registers as executor index 4, which executor 'first' "
                    "holds") in str(refused.value)
            assert "ALREADY_EXISTS" in str(refused.value)
            # Nothing of the refused one is left; the first serves on.
            (listed,) = admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors
            assert listed.executor_id == "first"
