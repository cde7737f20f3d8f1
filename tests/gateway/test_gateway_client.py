"""GatewayClient and `pagedserve generate` against real allocator, executor and gateway
processes on loopback, serving the embedded default model."""
from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from pagedserve.gateway_client import Completion, GatewayClient, ModelInfo
from pagedserve.supervisor.service_process import (REPO_ROOT, GatewayProcess, gateway_stack,
                                                   hermetic_env)

MODEL = "pagedserve-embedded-llama"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[GatewayProcess]:
    with gateway_stack(tmp_path_factory.mktemp("cache")) as (_, gateway):
        yield gateway


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[GatewayClient]:
    with GatewayClient(gateway.target, timeout_s=60) as client:
        yield client


def pagedserve(*args: str) -> subprocess.Popen[bytes]:
    """`pagedserve ARGS` as a subprocess; its output stays bytes, since text mode would turn a
    carriage return the model generates into a newline."""
    return subprocess.Popen(
        [sys.executable, "-m", "pagedserve.cli.main", *args], cwd=REPO_ROOT,
        env=hermetic_env({"PYTHONIOENCODING": "utf-8"}), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)


def run_pagedserve(*args: str) -> tuple[int, str, str]:
    process = pagedserve(*args)
    stdout, stderr = process.communicate(timeout=60)
    return process.returncode, stdout.decode(), stderr.decode()


def test_complete_assembles_exactly_the_streamed_deltas_and_reports_usage(client):
    options = dict(max_tokens=12, temperature=0, ignore_eos=True)
    generation = client.stream("Hello, client", **options)
    deltas = list(generation)
    completion = client.complete("Hello, client", **options)
    assert completion.texts == ["".join(d.text for d in deltas)]
    assert completion.token_ids == [[t for d in deltas for t in d.token_ids]]
    assert len(completion.token_ids[0]) == 12
    assert completion.finish_reasons == ["length"]
    assert [d.finish_reason for d in deltas][-1] == "length"
    assert {d.finish_reason for d in deltas[:-1]} <= {None}
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (13, 12)
    assert generation.usage is not None and generation.usage.completion_tokens == 12
    assert (generation.model, completion.model) == (MODEL, MODEL)
    assert generation.request_id.startswith("gw-")
    assert completion.request_id.startswith("gw-")
    assert completion.request_id != generation.request_id


def test_n_completions_with_a_seed_are_reproducible_and_each_finish_by_length(client):
    options = dict(n=2, seed=7, max_tokens=6, temperature=1.0, ignore_eos=True)
    first = client.complete("Once upon", **options)
    assert first.finish_reasons == ["length", "length"]
    assert [len(ids) for ids in first.token_ids] == [6, 6]
    assert first.usage is not None and first.usage.completion_tokens == 12
    again = client.complete("Once upon", **options)
    assert again.token_ids == first.token_ids and again.texts == first.texts


def test_token_id_and_chat_prompts_are_sent_as_such(client):
    by_text = client.complete("Hi", max_tokens=4, temperature=0, ignore_eos=True)
    by_ids = client.complete(list(b"Hi"), max_tokens=4, temperature=0, ignore_eos=True)
    assert by_ids.token_ids == by_text.token_ids
    chat = [{"role": "user", "content": "Hi"}]
    assert len(client.tokenize(chat)) > len(client.tokenize("Hi"))


def test_tokenize_is_byte_level_and_list_models_shows_the_one_model(client):
    assert client.tokenize("hé") == list("hé".encode())
    (model,) = client.list_models()
    assert model == ModelInfo(MODEL, model.max_model_len, 262, 1) and model.max_model_len > 0


def test_a_bad_option_raises_rpc_error_naming_the_field(client):
    with pytest.raises(grpc.RpcError) as caught:
        client.complete("x", top_p=1.5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_p" in caught.value.details()
    with pytest.raises(TypeError):
        client.stream([1, "two"])


def test_cancel_ends_the_stream_quietly(client):
    generation = client.stream("a long one", max_tokens=3000, temperature=0, ignore_eos=True)
    deltas = iter(generation)
    next(deltas)
    generation.cancel()
    rest = list(deltas)  # our own cancel ends the iteration without raising CANCELLED
    assert all(delta.finish_reason in (None, "cancelled") for delta in rest)
    assert generation.model == MODEL


def test_cli_generate_streams_the_same_text_as_complete(gateway, client):
    code, stdout, stderr = run_pagedserve("generate", "Hello", "--target", gateway.target,
                                          "--max-tokens", "8", "--temperature", "0", "--usage")
    assert code == 0, stderr
    expected: Completion = client.complete("Hello", max_tokens=8, temperature=0)
    assert stdout == expected.texts[0] + "\n"
    assert f"completion_tokens={expected.usage.completion_tokens}" in stderr


def test_cli_generate_prints_each_of_n_completions_under_a_header(gateway, client):
    code, stdout, stderr = run_pagedserve("generate", "Once upon", "--target", gateway.target,
                                          "--n", "2", "--seed", "7", "--max-tokens", "6")
    assert code == 0, stderr
    expected = client.complete("Once upon", n=2, seed=7, max_tokens=6)
    blocks = {}
    for block in stdout.split("--- completion ")[1:]:
        index, text = block.split(" ---\n", 1)
        blocks[int(index)] = text.removesuffix("\n")
    assert blocks == dict(enumerate(expected.texts))


def test_cli_generate_reports_a_refused_request_and_exits_1(gateway):
    code, stdout, stderr = run_pagedserve("generate", "Hello", "--target", gateway.target,
                                          "--top-p", "1.5")
    assert code == 1
    assert stderr.startswith("error: INVALID_ARGUMENT: ") and "top_p" in stderr


def test_cli_generate_cancels_on_ctrl_c_and_exits_130(gateway):
    process = pagedserve("generate", "a long one", "--target", gateway.target,
                         "--max-tokens", "3000", "--temperature", "0")
    process.stdout.read(1)  # streaming has begun
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
