"""The gateway's health follows its executors: NOT_SERVING (HTTP 503) with none ready, SERVING
once one is, and back when it goes away; requests meanwhile get UNAVAILABLE, not a hang."""
from __future__ import annotations

import grpc
import httpx
import pytest

from pagedserve.common.client import is_serving
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess, ExecutorProcess, GatewayProcess
from tests.support.polling import wait_for


def test_health_is_serving_exactly_while_an_executor_is_ready(tmp_path):
    with AllocatorProcess() as allocator, \
            GatewayProcess("--allocator", allocator.target, "--refresh-s", "0.2",
                           wait_serving=False) as gateway:
        channel = gateway.channel()
        stub = pb_grpc.GatewayStub(channel)
        assert not is_serving(channel)
        assert httpx.get(f"{gateway.http_url}/health").status_code == 503
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(pb.GenerateRequest(text="anyone?"), timeout=10))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "no executor is ready" in caught.value.details()

        with ExecutorProcess("--allocator", allocator.target, "--num-blocks", "64",
                             env={"PAGEDSERVE_CACHE_DIR": str(tmp_path)}):
            wait_for(lambda: is_serving(channel), timeout_s=30)
            assert httpx.get(f"{gateway.http_url}/health").status_code == 200
            responses = list(stub.Generate(pb.GenerateRequest(
                text="now", sampling=pb.SamplingOptions(max_tokens=2, ignore_eos=True)),
                timeout=60))
            assert responses[-1].usage.completion_tokens == 2

        wait_for(lambda: not is_serving(channel), timeout_s=30)
        assert httpx.get(f"{gateway.http_url}/health").status_code == 503
