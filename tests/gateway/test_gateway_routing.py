"""Exact KV-aware routing with two executors, end to end: requests that share a long prefix
land on the executor whose pool holds it, seen in the usage's cached_tokens and in the
allocator's per-pool prefix-hit counters. Run with one allocator, and with an allocator group
of two shards that each own one of the executors: the gateway asks both shards and merges, so
routing stays exact across them."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import ExecutorProcess, GatewayProcess
from tests.support.allocator_group import Shards
from tests.support.polling import wait_for

BLOCK = 16
# Two long shared prefixes (a system prompt, a document), 10 blocks each.
PREFIX_P = ("You are a careful assistant who answers in one short sentence. " * 4)[:10 * BLOCK]
PREFIX_Q = ("Document: the quick brown fox jumps over the lazy dog again. " * 4)[:10 * BLOCK]


@dataclass
class Stack:
    allocators: Shards
    stub: pb_grpc.GatewayStub
    executor_ids: list[str]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-allocator", "two-shards"])
def stack(request, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    env = {"PAGEDSERVE_CACHE_DIR": str(cache)}
    with Shards.start(request.param) as allocators:
        # With two shards, one executor on each (each registers with the shard it hashes to).
        executor_ids = (allocators.executor_ids("exec") if request.param == 2
                        else ["exec-a", "exec-b"])
        with ExecutorProcess("--allocator", allocators.target, "--executor-id", executor_ids[0],
                             "--num-blocks", "256", env=env), \
                ExecutorProcess("--allocator", allocators.target, "--executor-id",
                                executor_ids[1], "--num-blocks", "256", env=env), \
                GatewayProcess("--allocator", allocators.target, "--refresh-s",
                               "0.2") as gateway:
            if request.param == 2:
                assert [list(allocators.epochs(0)), list(allocators.epochs(1))] == [
                    [executor_ids[0]], [executor_ids[1]]]
            stub = pb_grpc.GatewayStub(gateway.channel())
            wait_for(lambda: stub.ListModels(pb.ListModelsRequest()).models[0].num_executors
                     == 2, timeout_s=30)
            yield Stack(allocators, stub, executor_ids)


def hits_per_pool(stack: Stack) -> dict[str, int]:
    return {pool.executor_id: pool.prefix_hit_tokens for pool in stack.allocators.stats().pools}


def generate(stub, text: str) -> pb.Usage:
    responses = list(stub.Generate(pb.GenerateRequest(text=text, sampling=pb.SamplingOptions(
        temperature=0, max_tokens=4, ignore_eos=True)), timeout=60))
    return responses[-1].usage


def long_stream(stub, text: str):
    call = stub.Generate(pb.GenerateRequest(text=text, sampling=pb.SamplingOptions(
        temperature=0, max_tokens=2000, ignore_eos=True)), timeout=60)
    next(call)   # running now
    return call


def gained_hits(stack: Stack, before: dict[str, int]) -> dict[str, int]:
    after = hits_per_pool(stack)
    return {executor: hits - before.get(executor, 0) for executor, hits in after.items()
            if hits != before.get(executor, 0)}


def serving(stack: Stack) -> set[str]:
    """The executors that hold a live sequence now, over every shard."""
    return set(stack.allocators.sequences())


def test_requests_sharing_a_prefix_go_where_it_is_cached(stack):
    stub = stack.stub
    assert generate(stub, PREFIX_P + " Question 0?").cached_tokens == 0
    # A long request sharing P's prefix follows it to its executor and keeps that one busy,
    # so Q's first request goes to the other executor on load.
    before = hits_per_pool(stack)
    busy = long_stream(stub, PREFIX_P + " keep this executor busy")
    (holder_of_p,) = gained_hits(stack, before)
    assert generate(stub, PREFIX_Q + " Question 0?").cached_tokens == 0
    busy.cancel()
    wait_for(lambda: stack.allocators.used_blocks() == 0)
    # Idle again; the cached prefixes alone now decide, request by request.
    served_by: dict[str, set[str]] = {PREFIX_P: set(), PREFIX_Q: set()}
    for round_ in range(1, 4):
        for prefix in (PREFIX_P, PREFIX_Q):
            before = hits_per_pool(stack)
            usage = generate(stub, f"{prefix} Question {round_} differs?")
            assert usage.cached_tokens == len(prefix), "the whole shared prefix was cached"
            gained = gained_hits(stack, before)
            assert list(gained.values()) == [len(prefix)]
            served_by[prefix] |= set(gained)
    assert served_by[PREFIX_P] == {holder_of_p}
    assert served_by[PREFIX_Q] == set(stack.executor_ids) - {holder_of_p}
    wait_for(lambda: stack.allocators.used_blocks() == 0)


def test_an_unrelated_prompt_goes_to_the_less_loaded_executor(stack):
    stub = stack.stub
    first = long_stream(stub, "busy " * 10)
    (busy,) = serving(stack)
    second = long_stream(stub, "a fresh topic entirely")
    both = serving(stack)
    first.cancel()
    second.cancel()
    assert both == set(stack.executor_ids), f"both went to {busy}"
    wait_for(lambda: stack.allocators.used_blocks() == 0)
