"""The topology docker-compose.yml describes (cpu profile, two executor replicas), run as local
processes from the compose file's own commands and environment, with a real Redis, and streamed
through: what `docker compose up` would start, minus Docker. Also with docker-compose.shards.yml
laid over it: an allocator group of four shards."""
from __future__ import annotations

import httpx
import pytest

from pagedserve.gateway_client import GatewayClient
from pagedserve.supervisor.redis_server import RedisProcess
from pagedserve.supervisor.service_process import (AllocatorProcess, ExecutorProcess,
                                                   GatewayProcess, pagedctl_audit)
from tests.support.allocator_group import Shards
from tests.support.compose_file import active_services, load_compose
from tests.support.polling import wait_for

PROCESSES = {"allocator_service": AllocatorProcess, "executor_service": ExecutorProcess,
             "gateway": GatewayProcess}
TOKEN = "compose-token"
KEY = "compose-key"


def local_args(command: list[str], addresses: dict[str, str]) -> list[str]:
    """A compose command as loopback flags: the module dropped (the process class adds it),
    other services' host names replaced by their local addresses, and every port the service
    listens on left to the process class (a free one)."""
    args = list(command[3:])
    out = []
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in ("--host", "--port"):
            skip = True          # ServiceProcess listens on 127.0.0.1, port 0
            continue
        if arg == "--http-port":
            out += [arg, "0"]
            skip = True
            continue
        for host, address in addresses.items():
            arg = arg.replace(host, address)
        out.append(arg)
    return out


def local_value(value: str, addresses: dict[str, str]) -> str:
    """An environment value with other services' host names replaced by local addresses."""
    for host, address in addresses.items():
        value = value.replace(host, address)
    return value


@pytest.fixture(params=[False, True], ids=["one-allocator", "four-shards"])
def stack(request, redis_server: RedisProcess, tmp_path):
    env = {"PAGEDSERVE_AUTH_TOKEN": TOKEN, "PAGEDSERVE_API_KEYS": KEY}
    services = active_services(load_compose(env, shards=request.param), "cpu")
    redis_address = redis_server.url.split("//")[1].split("/")[0]
    cache = str(tmp_path / "cache")
    started = []

    def start(name: str, addresses: dict[str, str]):
        service = services[name]
        environment = {key: local_value(str(value), addresses)
                       for key, value in service["environment"].items()}
        process = PROCESSES[service["command"][2]](
            *local_args(service["command"], addresses),
            env={**environment, "PAGEDSERVE_CACHE_DIR": cache})
        started.append(process)
        return process

    try:
        allocators = [start(name, {"redis:6379": redis_address}) for name in services
                      if name.startswith("allocator")]
        addresses = {f"{name}:50052": allocator.target for name, allocator in zip(
            [name for name in services if name.startswith("allocator")], allocators)}
        executors = [start("executor-cpu", addresses) for _ in range(2)]   # --scale 2
        gateway = start("gateway", addresses)
        yield Shards(allocators, TOKEN), executors, gateway
    finally:
        for process in reversed(started):
            process.stop()


def test_the_compose_topology_serves_streams_over_grpc_and_http(stack, redis_server):
    allocators, executors, gateway = stack
    stats = allocators.stats()
    assert stats.state_store.startswith("redis://"), "durable, as compose configures it"
    assert len(stats.pools) == 2, "both replicas registered"
    with GatewayClient(gateway.target, api_key=KEY, timeout_s=120) as client:
        wait_for(lambda: client.list_models()[0].num_executors == 2, timeout_s=30)
        deltas = list(client.stream("Hello, compose", max_tokens=16, temperature=0,
                                    ignore_eos=True))
        assert sum(len(d.token_ids) for d in deltas) == 16
        assert deltas[-1].finish_reason == "length"
    response = httpx.post(f"{gateway.http_url}/v1/completions", timeout=120,
                          headers={"authorization": f"Bearer {KEY}"},
                          json={"prompt": "Hello, compose", "max_tokens": 16, "temperature": 0,
                                "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == "".join(d.text for d in deltas)
    wait_for(lambda: allocators.used_blocks() == 0)
    audit = pagedctl_audit(allocators, TOKEN)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
