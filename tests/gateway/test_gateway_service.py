"""The gateway end to end: real allocator, executor and gateway processes on loopback, the
embedded default model, the gRPC Gateway API."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.model.embedded import embedded_model_dir
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.protocol.sampling_params import SamplingParams
from pagedserve.supervisor.service_process import (AllocatorProcess, GatewayProcess, gateway_stack,
                                                   pagedctl_audit)
from tests.support.allocator_wire import used_blocks
from tests.support.polling import wait_for

MODEL = "pagedserve-embedded-llama"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[AllocatorProcess, GatewayProcess, Path]]:
    cache = tmp_path_factory.mktemp("cache")
    with gateway_stack(cache) as (allocator, gateway):
        yield allocator, gateway, cache


def stub(gateway: GatewayProcess) -> pb_grpc.GatewayStub:
    return pb_grpc.GatewayStub(gateway.channel())


def greedy(max_tokens: int, **options) -> pb.SamplingOptions:
    return pb.SamplingOptions(temperature=0, max_tokens=max_tokens, ignore_eos=True, **options)


def test_a_text_prompt_streams_the_engines_greedy_tokens_as_their_text(stack):
    allocator, gateway, cache = stack
    responses = list(stub(gateway).Generate(pb.GenerateRequest(
        text="Hello, gateway", sampling=greedy(20)), timeout=60))
    assert len(responses) > 2, "text arrives as a stream"
    assert (responses[0].model, responses[0].request_id[:3]) == (MODEL, "gw-")
    token_ids = [t for r in responses for c in r.choices for t in c.token_ids]
    engine = build_engine(embedded_model_dir(cache), EngineOptions(num_blocks=64),
                          LocalBlockAllocator())
    (expected,) = generate(engine, [list(b"Hello, gateway")],
                           SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert token_ids == expected.choices[0]
    text = "".join(c.text for r in responses for c in r.choices)
    assert text == bytes(token_ids).decode("utf-8", errors="replace")
    last = responses[-1]
    assert last.choices[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (14, 20)
    wait_for(lambda: used_blocks(allocator) == 0)
    assert "no violations" in pagedctl_audit(allocator).stdout


def test_tokenize_and_list_models_describe_the_served_model(stack):
    _, gateway, _ = stack
    reply = stub(gateway).Tokenize(pb.TokenizeRequest(text="hé"))
    assert list(reply.token_ids) == list("hé".encode()) and reply.max_model_len > 0
    (model,) = stub(gateway).ListModels(pb.ListModelsRequest()).models
    assert (model.id, model.vocab_size, model.num_executors) == (MODEL, 262, 1)


@pytest.mark.parametrize("request_, message", [
    (pb.GenerateRequest(text=""), "prompt must not be empty"),
    (pb.GenerateRequest(text="x", model="gpt-17"), "model 'gpt-17' is not served"),
    (pb.GenerateRequest(text="x", sampling=pb.SamplingOptions(top_p=1.5)), "top_p"),
    (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 4000])), "token_ids[1] = 4000"),
])
def test_bad_requests_are_refused_with_a_message_naming_the_field(stack, request_, message):
    _, gateway, _ = stack
    with pytest.raises(grpc.RpcError) as caught:
        list(stub(gateway).Generate(request_, timeout=30))
    assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert message in caught.value.details()


def test_a_stop_string_ends_the_stream_before_it_and_frees_the_executor_request(stack):
    allocator, gateway, _ = stack
    prompt = pb.GenerateRequest(text="Hello, gateway", sampling=greedy(40))
    full = "".join(c.text for r in stub(gateway).Generate(prompt, timeout=60)
                   for c in r.choices)
    stop = full[10:13]
    assert stop and full.index(stop) == 10, "pick a stop string that first occurs at 10"
    stopped = pb.GenerateRequest(text="Hello, gateway", sampling=greedy(40), stop=[stop])
    responses = list(stub(gateway).Generate(stopped, timeout=60))
    assert "".join(c.text for r in responses for c in r.choices) == full[:10]
    assert responses[-1].choices[-1].finish_reason == pb.FINISH_REASON_STOP
    wait_for(lambda: used_blocks(allocator) == 0)


def test_a_client_that_cancels_mid_stream_leaves_no_block_behind(stack):
    allocator, gateway, _ = stack
    call = stub(gateway).Generate(pb.GenerateRequest(text="a long one", sampling=greedy(3000)),
                                  timeout=60)
    next(call)
    next(call)
    call.cancel()
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
