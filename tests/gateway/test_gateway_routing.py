"""Exact KV-aware routing with two executors, end to end: requests that share a long prefix
land on the executor whose pool holds it, seen in the usage's cached_tokens and in the
allocator's per-pool prefix-hit counters."""
from __future__ import annotations

import pytest

from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.allocator.v1 import allocator_pb2_grpc as apb_grpc
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess, ExecutorProcess, GatewayProcess
from tests.support.allocator_wire import used_blocks
from tests.support.polling import wait_for

BLOCK = 16
# Two long shared prefixes (a system prompt, a document), 10 blocks each.
PREFIX_P = ("You are a careful assistant who answers in one short sentence. " * 4)[:10 * BLOCK]
PREFIX_Q = ("Document: the quick brown fox jumps over the lazy dog again. " * 4)[:10 * BLOCK]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    env = {"PAGEDSERVE_CACHE_DIR": str(cache)}
    with AllocatorProcess() as allocator, \
            ExecutorProcess("--allocator", allocator.target, "--executor-id", "exec-a",
                            "--num-blocks", "256", env=env), \
            ExecutorProcess("--allocator", allocator.target, "--executor-id", "exec-b",
                            "--num-blocks", "256", env=env), \
            GatewayProcess("--allocator", allocator.target, "--refresh-s", "0.2") as gateway:
        stub = pb_grpc.GatewayStub(gateway.channel())
        wait_for(lambda: stub.ListModels(pb.ListModelsRequest()).models[0].num_executors == 2,
                 timeout_s=30)
        yield allocator, stub


def hits_per_pool(allocator) -> dict[str, int]:
    stats = apb_grpc.AllocatorAdminStub(allocator.channel()).GetStats(apb.GetStatsRequest())
    return {pool.executor_id: pool.prefix_hit_tokens for pool in stats.pools}


def generate(stub, text: str) -> pb.Usage:
    responses = list(stub.Generate(pb.GenerateRequest(text=text, sampling=pb.SamplingOptions(
        temperature=0, max_tokens=4, ignore_eos=True)), timeout=60))
    return responses[-1].usage


def long_stream(stub, text: str):
    call = stub.Generate(pb.GenerateRequest(text=text, sampling=pb.SamplingOptions(
        temperature=0, max_tokens=2000, ignore_eos=True)), timeout=60)
    next(call)   # running now
    return call


def gained_hits(allocator, before: dict[str, int]) -> dict[str, int]:
    after = hits_per_pool(allocator)
    return {executor: hits - before.get(executor, 0) for executor, hits in after.items()
            if hits != before.get(executor, 0)}


def test_requests_sharing_a_prefix_go_where_it_is_cached(stack):
    allocator, stub = stack
    assert generate(stub, PREFIX_P + " Question 0?").cached_tokens == 0
    # A long request sharing P's prefix follows it to its executor and keeps that one busy,
    # so Q's first request goes to the other executor on load.
    before = hits_per_pool(allocator)
    busy = long_stream(stub, PREFIX_P + " keep this executor busy")
    (holder_of_p,) = gained_hits(allocator, before)
    assert generate(stub, PREFIX_Q + " Question 0?").cached_tokens == 0
    busy.cancel()
    wait_for(lambda: used_blocks(allocator) == 0)
    # Idle again; the cached prefixes alone now decide, request by request.
    served_by: dict[str, set[str]] = {PREFIX_P: set(), PREFIX_Q: set()}
    for round_ in range(1, 4):
        for prefix in (PREFIX_P, PREFIX_Q):
            before = hits_per_pool(allocator)
            usage = generate(stub, f"{prefix} Question {round_} differs?")
            assert usage.cached_tokens == len(prefix), "the whole shared prefix was cached"
            gained = gained_hits(allocator, before)
            assert list(gained.values()) == [len(prefix)]
            served_by[prefix] |= set(gained)
    assert served_by[PREFIX_P] == {holder_of_p}
    assert served_by[PREFIX_Q] == {"exec-a", "exec-b"} - {holder_of_p}
    wait_for(lambda: used_blocks(allocator) == 0)


def test_an_unrelated_prompt_goes_to_the_less_loaded_executor(stack):
    allocator, stub = stack
    admin = apb_grpc.AllocatorAdminStub(allocator.channel())
    first = long_stream(stub, "busy " * 10)
    (busy,) = {seq.executor_id for seq in admin.ListSequences(
        apb.ListSequencesRequest()).sequences}
    second = long_stream(stub, "a fresh topic entirely")
    serving = {seq.executor_id for seq in admin.ListSequences(
        apb.ListSequencesRequest()).sequences}
    first.cancel()
    second.cancel()
    assert serving == {"exec-a", "exec-b"}, f"both went to {busy}"
    wait_for(lambda: used_blocks(allocator) == 0)
