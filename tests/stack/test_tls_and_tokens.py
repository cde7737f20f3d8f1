"""TLS on every hop and tokens on every service, with certificates this test makes: the
allocator, the executor and the gateway (gRPC and HTTP) serve TLS; the executor and the gateway
reach the allocator, and the gateway the executor, verifying it; clients do too. A plaintext
caller, or one that trusts another CA, is refused; so is a call with a missing or wrong token.
"""
from __future__ import annotations

import ssl

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.common.client import open_channel
from pagedserve.executor.v1 import executor_pb2 as epb
from pagedserve.executor.v1 import executor_pb2_grpc as epb_grpc
from pagedserve.gateway_client import GatewayClient
from pagedserve.supervisor.service_process import (AllocatorProcess, ExecutorProcess,
                                                   GatewayProcess, pagedctl_audit)
from tests.support.allocator_wire import used_blocks
from tests.support.polling import wait_for
from tests.support.tls_certs import make_certificates

SERVICE_TOKEN = "service-secret"
API_KEY = "sk-tenant"
MODEL = "pagedserve-embedded-llama"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory, certificates):
    ca = str(certificates.ca)
    tls = ("--tls-cert", str(certificates.cert), "--tls-key", str(certificates.key))
    token = ("--auth-token", SERVICE_TOKEN)
    cache = {"PAGEDSERVE_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    # The test's own channels carry the token only where a call needs it (health is open).
    with AllocatorProcess(*tls, *token, tls_ca=ca) as allocator, \
            ExecutorProcess("--allocator", allocator.target, "--tls-ca", ca, *tls, *token,
                            "--num-blocks", "64", env=cache, tls_ca=ca) as executor, \
            GatewayProcess("--allocator", allocator.target, "--tls-ca", ca, *tls, *token,
                           "--api-key", API_KEY, "--refresh-s", "0.2", tls_ca=ca) as gateway:
        yield allocator, executor, gateway


def test_a_generation_crosses_every_hop_over_tls(stack, certificates):
    allocator, _, gateway = stack
    with GatewayClient(gateway.target, api_key=API_KEY, tls_ca=str(certificates.ca)) as client:
        completion = client.complete("over TLS", max_tokens=8, temperature=0, ignore_eos=True)
    assert len(completion.token_ids[0]) == 8 and completion.finish_reasons == ["length"]

    assert gateway.http_url.startswith("https://")
    with httpx.Client(verify=trusting(certificates.ca)) as http, \
            openai.OpenAI(base_url=f"{gateway.http_url}/v1", api_key=API_KEY, max_retries=0,
                          http_client=http) as client:
        text = client.completions.create(model=MODEL, prompt="over TLS", max_tokens=8,
                                         temperature=0, extra_body={"ignore_eos": True})
    assert text.usage.completion_tokens == 8
    assert text.choices[0].text == completion.texts[0]
    wait_for(lambda: used_blocks(allocator, SERVICE_TOKEN) == 0)
    audit = pagedctl_audit(allocator, SERVICE_TOKEN)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout


@pytest.mark.parametrize("service", ["allocator", "executor", "gateway"])
def test_a_plaintext_caller_is_refused(stack, service):
    target = stack[["allocator", "executor", "gateway"].index(service)].target
    assert health_check_refusal(open_channel(target)) == grpc.StatusCode.UNAVAILABLE


def test_a_caller_that_trusts_another_ca_is_refused(stack, tmp_path):
    _, _, gateway = stack
    stranger = make_certificates(tmp_path / "stranger")
    assert health_check_refusal(open_channel(gateway.target, tls_ca=str(stranger.ca))) \
        == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{gateway.http_url}/health", verify=trusting(stranger.ca))
    with pytest.raises(httpx.HTTPError):   # plaintext HTTP to the TLS port
        httpx.get(gateway.http_url.replace("https://", "http://") + "/health", timeout=5)


@pytest.mark.parametrize("token", ["", "wrong-secret"], ids=["missing", "wrong"])
def test_every_executor_rpc_wants_the_service_token(stack, token):
    _, executor, _ = stack
    stub = epb_grpc.ExecutorStub(executor.channel(token))
    calls = {
        "GetInfo": lambda: stub.GetInfo(epb.GetInfoRequest(), timeout=10),
        "GetTokenizer": lambda: list(stub.GetTokenizer(epb.GetTokenizerRequest(), timeout=10)),
        "Session": lambda: list(stub.Session(iter([epb.SessionRequest(
            submit=epb.SubmitRequest(request_id="intruder", prompt_token_ids=[1, 2, 3]))]),
            timeout=10)),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        assert "--auth-token" in refused.value.details(), name
    # With the token the same channel kind works: the refusals were about the token.
    info = epb_grpc.ExecutorStub(executor.channel(SERVICE_TOKEN)).GetInfo(epb.GetInfoRequest())
    assert info.model_name == MODEL


@pytest.mark.parametrize("key", ["", "sk-wrong"], ids=["missing", "wrong"])
def test_the_gateway_wants_an_api_key_on_grpc_and_http(stack, certificates, key):
    _, _, gateway = stack
    with GatewayClient(gateway.target, api_key=key, tls_ca=str(certificates.ca)) as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.complete("no key", max_tokens=2)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(f"{gateway.http_url}/v1/completions", headers=headers,
                          json={"model": MODEL, "prompt": "no key", "max_tokens": 2},
                          verify=trusting(certificates.ca))
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


def trusting(ca) -> ssl.SSLContext:
    """What an HTTPS client verifies the gateway with: this CA only."""
    return ssl.create_default_context(cafile=str(ca))


def health_check_refusal(channel: grpc.Channel) -> grpc.StatusCode:
    """The status a health check on `channel` fails with (then the channel is closed)."""
    try:
        with pytest.raises(grpc.RpcError) as refused:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                      timeout=5)
        return refused.value.code()
    finally:
        channel.close()
