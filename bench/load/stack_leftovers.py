"""What a gateway stack must drain to zero once every client is gone: used blocks and
sequences in the allocator, running and waiting requests in each executor, running and queued
requests in the gateway's admission. The client-storm test and `make soak` both wait for it."""
from __future__ import annotations

import time

import httpx

from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.allocator.v1 import allocator_pb2_grpc as apb_grpc
from pagedserve.common.client import open_channel
from pagedserve.executor.v1 import executor_pb2 as epb
from pagedserve.executor.v1 import executor_pb2_grpc as epb_grpc


def leftovers(allocator_target: str, gateway_http_url: str) -> dict[str, int]:
    """Each count that must be zero, by name (executors by their id)."""
    channel = open_channel(allocator_target)
    try:
        admin = apb_grpc.AllocatorAdminStub(channel)
        total = admin.GetStats(apb.GetStatsRequest(), timeout=10).total
        executors = admin.ListExecutors(apb.ListExecutorsRequest(), timeout=10).executors
    finally:
        channel.close()
    found = {"used blocks": total.num_used_blocks, "allocator sequences": total.num_sequences}
    for executor in executors:
        # The executor's own count, live; the allocator's copy is only as fresh as a heartbeat.
        channel = open_channel(executor.address)
        try:
            info = epb_grpc.ExecutorStub(channel).GetInfo(epb.GetInfoRequest(), timeout=10)
        finally:
            channel.close()
        found[f"executor {executor.executor_id} running"] = info.num_running
        found[f"executor {executor.executor_id} waiting"] = info.num_waiting
    metrics = gateway_metrics(gateway_http_url)
    found["gateway running"] = int(metrics["pagedserve_gateway_requests_running"])
    found["gateway queued"] = int(metrics["pagedserve_gateway_requests_queued"])
    return found


def drained(allocator_target: str, gateway_http_url: str, timeout_s: float = 60.0
            ) -> dict[str, int]:
    """Polls `leftovers` until every count is zero or `timeout_s` passes; the last counts."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = leftovers(allocator_target, gateway_http_url)
        if set(found.values()) <= {0} or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def gateway_metrics(gateway_http_url: str) -> dict[str, float]:
    """The gateway's /metrics, each sample by its full name with labels."""
    text = httpx.get(f"{gateway_http_url}/metrics", timeout=10).text
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines()
             if line and not line.startswith("#"))}


def gateway_outcomes(gateway_http_url: str) -> dict[str, int]:
    """pagedserve_gateway_requests_total summed over the APIs, by outcome."""
    outcomes: dict[str, int] = {}
    for name, value in gateway_metrics(gateway_http_url).items():
        if name.startswith("pagedserve_gateway_requests_total{"):
            outcome = name.split('outcome="', 1)[1].split('"', 1)[0]
            outcomes[outcome] = outcomes.get(outcome, 0) + int(value)
    return outcomes
