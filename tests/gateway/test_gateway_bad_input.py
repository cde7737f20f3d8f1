"""Bad requests to the gateway, on gRPC and HTTP: each gets the right status and a message naming
what is wrong; afterwards the gateway still serves and no KV block is left behind."""
from __future__ import annotations

import httpx
import pytest
from grpc import RpcError, StatusCode

from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import gateway_stack, pagedctl_audit
from tests.support.allocator_wire import used_blocks
from tests.support.oversized_messages import (OVERSIZED_CHARS, OVERSIZED_INPUT, OVERSIZED_MESSAGE,
                                              oversized_channel)
from tests.support.polling import wait_for

KEY = "sk-bad-input"
AUTH = [("authorization", f"Bearer {KEY}")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with gateway_stack(tmp_path_factory.mktemp("cache"), num_blocks=128,
                       gateway_args=("--api-key", KEY)) as (allocator, gateway):
        stub = pb_grpc.GatewayStub(gateway.channel())
        (model,) = stub.ListModels(pb.ListModelsRequest(), metadata=AUTH).models
        yield allocator, gateway, stub, model.max_model_len


def sampling(**fields) -> pb.SamplingOptions:
    return pb.SamplingOptions(**fields)


# Stands for a prompt one token over the context window, built once the window is known.
LONG_PROMPT = "'y' × max_model_len (one token past the window)"

# (request, status, what the message must say)
GRPC_CASES = {
    "empty prompt": (pb.GenerateRequest(text=""), StatusCode.INVALID_ARGUMENT,
                     "prompt must not be empty"),
    "no prompt": (pb.GenerateRequest(), StatusCode.INVALID_ARGUMENT, "give exactly one of"),
    "empty token ids": (pb.GenerateRequest(token_ids=pb.TokenIds()),
                        StatusCode.INVALID_ARGUMENT, "token ids must not be empty"),
    "prompt over the context window": (LONG_PROMPT, StatusCode.INVALID_ARGUMENT,
                                       "leaves no room to generate"),
    "prompt over 4 Mi characters": (pb.GenerateRequest(text="y" * ((4 << 20) + 1)),
                                    StatusCode.INVALID_ARGUMENT,
                                    "prompt has 4194305 characters, more than 4194304"),
    "max_tokens 0": (pb.GenerateRequest(text="x", sampling=sampling(max_tokens=0)),
                     StatusCode.INVALID_ARGUMENT, "max_tokens must be >= 1"),
    "max_tokens past the window": (
        pb.GenerateRequest(text="x", sampling=sampling(max_tokens=10**6)),
        StatusCode.INVALID_ARGUMENT, "lower max_tokens to at most"),
    "temperature NaN": (pb.GenerateRequest(text="x", sampling=sampling(temperature=float("nan"))),
                        StatusCode.INVALID_ARGUMENT, "temperature must be >= 0, got nan"),
    "top_p over 1": (pb.GenerateRequest(text="x", sampling=sampling(top_p=1.5)),
                     StatusCode.INVALID_ARGUMENT, "top_p must be in (0, 1]"),
    "n 0": (pb.GenerateRequest(text="x", sampling=sampling(n=0)),
            StatusCode.INVALID_ARGUMENT, "n must be between 1 and 128, got 0"),
    "n huge": (pb.GenerateRequest(text="x", sampling=sampling(n=4_000_000_000)),
               StatusCode.INVALID_ARGUMENT, "n must be between 1 and 128"),
    "logprobs absurd": (pb.GenerateRequest(text="x", sampling=sampling(logprobs=10**6)),
                        StatusCode.INVALID_ARGUMENT, "logprobs must be between 0 and 20"),
    "token id outside the vocabulary": (
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=[72, 105, 9999])),
        StatusCode.INVALID_ARGUMENT, "token_ids[2] = 9999 is outside"),
    "negative token id": (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[-1])),
                          StatusCode.INVALID_ARGUMENT, "token_ids[0] = -1"),
    "unknown model": (pb.GenerateRequest(text="x", model="gpt-17"), StatusCode.NOT_FOUND,
                      "model 'gpt-17' is not served here"),
    "stop string too long": (pb.GenerateRequest(text="x", stop=["s" * 65]),
                             StatusCode.INVALID_ARGUMENT, "stop[0] must be 1 to 64"),
    "unknown chat role": (pb.GenerateRequest(chat=pb.ChatPrompt(
        messages=[pb.ChatMessage(role="wizard", content="hi")])),
        StatusCode.INVALID_ARGUMENT, "messages[0].role"),
    "17 stop strings": (pb.GenerateRequest(text="x", stop=["s"] * 17),
                        StatusCode.INVALID_ARGUMENT, "stop holds 17 strings, at most 16"),
    "cache_salt over 256 characters": (pb.GenerateRequest(text="x", cache_salt="s" * 257),
                                       StatusCode.INVALID_ARGUMENT,
                                       "cache_salt must be at most 256 characters"),
    "seed over 2**63": (pb.GenerateRequest(text="x", sampling=sampling(seed=2**64 - 1)),
                        StatusCode.INVALID_ARGUMENT, "seed must be between 0 and 2**63-1"),
    "top_k past the vocabulary": (
        pb.GenerateRequest(text="x", sampling=sampling(top_k=10**6)),
        StatusCode.INVALID_ARGUMENT, "top_k must be between 0 (off) and the vocabulary size"),
    "stop token outside the vocabulary": (
        pb.GenerateRequest(text="x", sampling=sampling(stop_token_ids=[99999])),
        StatusCode.INVALID_ARGUMENT, "stop_token_ids must be in [0, 262), got 99999"),
}


@pytest.mark.parametrize("case", GRPC_CASES)
def test_grpc_bad_inputs_are_refused_by_name(stack, case):
    _, _, stub, max_model_len = stack
    request, status, message = GRPC_CASES[case]
    if request == LONG_PROMPT:
        request = pb.GenerateRequest(text="y" * max_model_len)
    with pytest.raises(RpcError) as caught:
        list(stub.Generate(request, metadata=AUTH, timeout=30))
    assert caught.value.code() == status
    assert message in caught.value.details()


# Generate requests as bytes on the wire: (body, status, what the message says). A field sent
# with another wire type than its own is an unknown field to protobuf, so it reads as unset.
GRPC_WIRE_CASES = {
    "text not UTF-8": (b"\x12\x02\xff\xfe", StatusCode.INVALID_ARGUMENT,
                       "String field had bad UTF-8"),
    "text sent as a varint (wrong wire type)": (b"\x10\x05", StatusCode.INVALID_ARGUMENT,
                                                "give exactly one of"),
    "GenerateRequest that is not protobuf": (b"\x2a\x03\x08", StatusCode.INVALID_ARGUMENT,
                                             "does not parse as its message"),
    "message over the size limit": (OVERSIZED_INPUT, StatusCode.RESOURCE_EXHAUSTED,
                                    OVERSIZED_MESSAGE),
}


@pytest.mark.parametrize("case", GRPC_WIRE_CASES)
def test_grpc_bytes_that_are_no_valid_request_are_refused_by_status(stack, case):
    _, gateway, _, _ = stack
    body, status, message = GRPC_WIRE_CASES[case]
    if body == OVERSIZED_INPUT:
        body = pb.GenerateRequest(text="y" * OVERSIZED_CHARS).SerializeToString()
    with oversized_channel(gateway.target) as channel:
        generate = channel.unary_stream(
            "/pagedserve.gateway.v1.Gateway/Generate",
            request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
        with pytest.raises(RpcError) as caught:
            list(generate(body, metadata=AUTH, timeout=30))
    assert caught.value.code() == status
    assert message in caught.value.details()


# Stands for a body past the HTTP server's limit, built by the test.
BODY_OVER_LIMIT = "33 MiB of spaces (the limit is 32 MiB)"
CHAT = [{"role": "user", "content": "x"}]

# (endpoint, body: dict, raw bytes or a placeholder above, status, message part, param)
HTTP_CASES = {
    "empty prompt": ("completions", {"prompt": ""}, 400, "prompt must not be empty", "prompt"),
    "prompt over the window": ("completions", LONG_PROMPT, 400, "leaves no room", None),
    "max_tokens 0": ("completions", {"prompt": "x", "max_tokens": 0}, 400,
                     "max_tokens must be >= 1", "max_tokens"),
    "max_tokens negative": ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                 "max_tokens": -5}, 400,
                            "max_tokens must be >= 1", "max_tokens"),
    "temperature NaN": ("completions", b'{"prompt": "x", "temperature": NaN}', 400,
                        "temperature must be >= 0, got nan", "temperature"),
    "temperature a string": ("completions", {"prompt": "x", "temperature": "hot"}, 400,
                             "temperature must be a number", "temperature"),
    "top_p over 1": ("completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p must be in",
                     "top_p"),
    "n 0": ("completions", {"prompt": "x", "n": 0}, 400, "n must be between 1", "n"),
    "n huge": ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                    "n": 10**12}, 400, "n must be between 1", "n"),
    "token ids outside the vocabulary": ("completions", {"prompt": [1, 2, 70000]}, 400,
                                         "prompt token_ids[2] = 70000", "prompt"),
    "lone surrogate": ("completions", b'{"prompt": "ok \\udc80"}', 400,
                       "not valid Unicode", "prompt"),
    "body not UTF-8": ("completions", b'{"prompt": "\xff\xfe"}', 400, "not valid JSON", None),
    "body not JSON": ("completions", b"{prompt: x", 400, "not valid JSON", None),
    "body not an object": ("completions", b"[1, 2]", 400, "must be a JSON object", None),
    "JSON bomb": ("completions", b"[" * 200_000 + b"]" * 200_000, 400, "nests too deeply",
                  None),
    "unknown model": ("completions", {"prompt": "x", "model": "gpt-17"}, 404,
                      "model 'gpt-17' is not served here", "model"),
    "no messages": ("chat/completions", {"messages": []}, 400,
                    "messages must hold at least one message", "messages"),
    "image content": ("chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400,
        "only text parts are supported", "messages[0].content[0]"),
    "tool without a function": ("chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400,
        "tools[0].function is required", "tools[0].function"),
    "too many batched prompts": ("completions", {"prompt": ["a"] * 257}, 400,
                                 "at most 256 prompts in one request, got 257", "prompt"),
    "an empty prompt in a batch": ("completions", {"prompt": ["a", ""]}, 400,
                                   "prompt[1] must not be empty", "prompt"),
    "negative token id": ("completions", {"prompt": [5, -3]}, 400, "prompt token_ids[1] = -3",
                          "prompt"),
    "n a boolean": ("completions", {"prompt": "x", "n": True}, 400,
                    "n must be an integer, got a boolean", "n"),
    "max_tokens a fraction": ("completions", {"prompt": "x", "max_tokens": 1.5}, 400,
                              "max_tokens must be an integer, got a number", "max_tokens"),
    "messages a string": ("chat/completions", {"messages": "hi"}, 400,
                          "messages must be an array, got a string", "messages"),
    "stop a number": ("completions", {"prompt": "x", "stop": 5}, 400,
                      "stop must be a string or an array, got an integer", "stop"),
    "logprobs absurd": ("completions", {"prompt": "x", "logprobs": 10**6}, 400,
                        "logprobs must be between 0 and 20", "logprobs"),
    "top_logprobs absurd": ("chat/completions", {"messages": CHAT, "logprobs": True,
                                                 "top_logprobs": 1000}, 400,
                            "top_logprobs must be between 0 and 20, got 1000", "top_logprobs"),
    "seed negative": ("completions", {"prompt": "x", "seed": -1}, 400,
                      "seed must be between 0 and 2**63-1, got -1", "seed"),
    "temperature infinite": ("completions", b'{"prompt": "x", "temperature": 1e400}', 400,
                             "temperature must be <= 100, got inf", "temperature"),
    "max_tokens 10**30": ("completions", {"prompt": "x", "max_tokens": 10**30}, 400,
                          "lower max_tokens to at most", None),
    "vLLM field not implemented": (
        "completions", {"prompt": "Hello", "max_tokens": 10, "temperature": 0,
                        "stop_token_ids": [117], "min_tokens": 8}, 400,
        "min_tokens is not supported", "min_tokens"),
    "unknown field": ("completions", {"prompt": "x", "max_token": 4}, 400,
                      "Unrecognized request argument supplied: max_token", "max_token"),
    "JSON bomb in an ignored field": (
        "chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "user": '
        + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nests too deeply", None),
    "body over the size limit": ("completions", BODY_OVER_LIMIT, 413,
                                 "the request body is over 32 MiB", None),
}


@pytest.mark.parametrize("case", HTTP_CASES)
def test_http_bad_inputs_get_openai_errors(stack, case):
    _, gateway, _, max_model_len = stack
    endpoint, body, status, message, param = HTTP_CASES[case]
    if body == LONG_PROMPT:
        body = {"prompt": "y" * max_model_len}
    elif body == BODY_OVER_LIMIT:
        body = b" " * (33 << 20)
    url = f"{gateway.http_url}/v1/{endpoint}"
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    if isinstance(body, bytes):
        response = httpx.post(url, content=body, headers=headers, timeout=30)
    else:
        response = httpx.post(url, json=body, headers=headers, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["code"] == ("model_not_found" if status == 404 else None)


def test_after_all_that_the_gateway_serves_and_nothing_leaked(stack):
    allocator, gateway, stub, _ = stack
    responses = list(stub.Generate(pb.GenerateRequest(
        text="still here", sampling=sampling(temperature=0, max_tokens=5, ignore_eos=True)),
        metadata=AUTH, timeout=60))
    assert responses[-1].usage.completion_tokens == 5
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
    metrics = httpx.get(f"{gateway.http_url}/metrics").text
    assert ('pagedserve_gateway_requests_total{api="grpc",'
            'model_name="pagedserve-embedded-llama",outcome="invalid"}') in metrics
