"""Many streams at once through the gateway: 200 concurrent greedy streams each equal the same
prompt served alone; a client killed mid-stream (SIGKILL, no goodbye) leaves no block behind."""
from __future__ import annotations

import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import REPO_ROOT, gateway_stack, pagedctl_audit
from tests.support.allocator_wire import used_blocks
from tests.support.polling import wait_for

STREAMS = 200
PROMPTS = [f"Request number {i}: tell me about {topic}" for i, topic in enumerate(
    ["paging", "blocks", "caches", "rivers", "trains", "stars", "salt", "glass", "tea",
     "maps", "bees", "clocks", "ropes", "kites", "ink", "wool", "iron", "moss", "snow",
     "sand", "oak", "reed", "fog", "clay", "wind"])]
SAMPLING = pb.SamplingOptions(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with gateway_stack(tmp_path_factory.mktemp("cache"), "--max-num-seqs", "256",
                       num_blocks=1024) as stack:
        yield stack


def served(stub, prompt: str) -> tuple[str, list[int]]:
    responses = list(stub.Generate(pb.GenerateRequest(text=prompt, sampling=SAMPLING),
                                   timeout=300))
    text = "".join(c.text for r in responses for c in r.choices)
    return text, [t for r in responses for c in r.choices for t in c.token_ids]


def test_200_concurrent_greedy_streams_each_equal_the_prompt_served_alone(stack):
    allocator, gateway = stack
    stub = pb_grpc.GatewayStub(gateway.channel())
    alone = {prompt: served(stub, prompt) for prompt in PROMPTS}
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(STREAMS)]
    with ThreadPoolExecutor(STREAMS) as pool:
        together = list(pool.map(lambda prompt: served(stub, prompt), prompts))
    mismatches = [i for i, prompt in enumerate(prompts) if together[i] != alone[prompt]]
    assert mismatches == []
    assert all(len(ids) == 12 for _, ids in together)
    wait_for(lambda: used_blocks(allocator) == 0)


CLIENT = """
import sys
from pagedserve.gateway_client import GatewayClient
with GatewayClient(sys.argv[1]) as client:
    for delta in client.stream("never ending", max_tokens=3000, temperature=0, ignore_eos=True):
        print("token", flush=True)
"""


def test_a_client_killed_mid_stream_leaves_no_block_behind(stack):
    allocator, gateway = stack
    client = subprocess.Popen([sys.executable, "-c", CLIENT, gateway.target], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):
            assert client.stdout.readline().startswith("token")
        assert used_blocks(allocator) > 0
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=10)
    finally:
        client.kill()
        client.stdout.close()
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
