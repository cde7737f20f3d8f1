"""What a Generate stream carries, end to end through real allocator, executor and gateway
processes: n > 1, logprobs, chat and token-id prompts, and multi-byte text from a model whose
tokens split Chinese characters and emoji."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from tokenizers import Tokenizer

from executor_service.model.embedded import write_embedded_checkpoint
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import gateway_stack
from tests.support.allocator_wire import used_blocks
from tests.support.model_checkpoints import write_checkpoint
from tests.support.polling import wait_for
from tests.support.sample_tokenizers import bytelevel_bpe


def start_stack(cache=None, *executor_args: str) -> Iterator[tuple]:
    with gateway_stack(cache, *executor_args) as (allocator, gateway):
        yield allocator, pb_grpc.GatewayStub(gateway.channel())


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    yield from start_stack(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def cjk_tokenizer():
    return bytelevel_bpe()


@pytest.fixture(scope="module")
def cjk(tmp_path_factory, cjk_tokenizer):
    """A random llama whose vocabulary is a byte-level BPE trained on Chinese and emoji: most of
    its tokens are a whole character or a piece of one."""
    directory = tmp_path_factory.mktemp("cjk-model")
    write_checkpoint("llama", directory, seed=3, vocab_size=cjk_tokenizer.get_vocab_size())
    cjk_tokenizer.save(str(directory / "tokenizer.json"))
    yield from start_stack(None, "--model", str(directory))


def sampling(max_tokens: int, **options) -> pb.SamplingOptions:
    options.setdefault("temperature", 0)
    return pb.SamplingOptions(max_tokens=max_tokens, ignore_eos=True, **options)


def per_choice(responses) -> dict[int, dict]:
    choices: dict[int, dict] = {}
    for response in responses:
        for delta in response.choices:
            choice = choices.setdefault(delta.index, {"text": [], "ids": [], "logprobs": [],
                                                      "finish": None})
            choice["text"].append(delta.text)
            choice["ids"] += delta.token_ids
            choice["logprobs"] += delta.logprobs
            if delta.finish_reason:
                choice["finish"] = delta.finish_reason
    return choices


def test_n_2_streams_two_indexed_completions_that_sampling_makes_differ(embedded):
    allocator, stub = embedded
    responses = list(stub.Generate(pb.GenerateRequest(
        text="Two ways to go", sampling=sampling(12, n=2, temperature=1.0, seed=11)),
        timeout=60))
    choices = per_choice(responses)
    assert sorted(choices) == [0, 1]
    assert all(len(c["ids"]) == 12 and c["finish"] == pb.FINISH_REASON_LENGTH
               for c in choices.values())
    assert choices[0]["ids"] != choices[1]["ids"]
    usage = responses[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (14, 24)
    wait_for(lambda: used_blocks(allocator) == 0)


def test_n_2_greedy_completions_are_identical(embedded):
    _, stub = embedded
    choices = per_choice(stub.Generate(pb.GenerateRequest(
        text="Twins", sampling=sampling(10, n=2)), timeout=60))
    assert choices[0]["ids"] == choices[1]["ids"] and len(choices[0]["ids"]) == 10


def test_logprobs_name_each_generated_token_and_its_best_alternatives(embedded):
    _, stub = embedded
    (choice,) = per_choice(stub.Generate(pb.GenerateRequest(
        text="Probabilities", sampling=sampling(8, logprobs=3)), timeout=60)).values()
    assert [entry.token_id for entry in choice["logprobs"]] == choice["ids"]
    for entry in choice["logprobs"]:
        assert len(entry.top) == 3
        # Greedy: the chosen token is the most likely one; alternatives come best first.
        assert entry.top[0].token_id == entry.token_id
        assert entry.top[0].logprob == pytest.approx(entry.logprob, abs=1e-4)
        assert entry.top[0].logprob >= entry.top[1].logprob >= entry.top[2].logprob
        assert entry.logprob <= 0
        assert entry.token == bytes([entry.token_id]).decode("utf-8", errors="replace")


def test_without_logprobs_none_are_sent(embedded):
    _, stub = embedded
    (choice,) = per_choice(stub.Generate(pb.GenerateRequest(
        text="No probabilities", sampling=sampling(4)), timeout=60)).values()
    assert choice["logprobs"] == []


def test_a_chat_prompt_is_rendered_with_the_template_and_served(embedded, tmp_path):
    _, stub = embedded
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(role="system", content="Be brief."),
                                   pb.ChatMessage(role="user", content="Hi there")])
    ids = list(stub.Tokenize(pb.TokenizeRequest(chat=chat)).token_ids)
    tokenizer = Tokenizer.from_file(str(write_embedded_checkpoint(tmp_path) / "tokenizer.json"))
    # The embedded checkpoint's template, its role markers special tokens.
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<|system|>Be brief.<|end|><|user|>Hi there<|end|><|assistant|>")
    responses = list(stub.Generate(pb.GenerateRequest(chat=chat, sampling=sampling(6)),
                                   timeout=60))
    assert responses[-1].usage.prompt_tokens == len(ids)
    # The same tokens as the rendered ids sent as the prompt.
    as_ids = per_choice(stub.Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=ids), sampling=sampling(6)), timeout=60))
    assert per_choice(responses)[0]["ids"] == as_ids[0]["ids"]


def test_a_token_id_prompt_is_served_like_the_text_it_encodes(embedded):
    _, stub = embedded
    by_text = per_choice(stub.Generate(pb.GenerateRequest(
        text="Hello, ids", sampling=sampling(10)), timeout=60))
    by_ids = per_choice(stub.Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=list(b"Hello, ids")), sampling=sampling(10)), timeout=60))
    assert by_ids[0]["ids"] == by_text[0]["ids"]
    assert "".join(by_ids[0]["text"]) == "".join(by_text[0]["text"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streamed_chinese_and_emoji_reassemble_exactly_to_the_full_decode(
        cjk, cjk_tokenizer, seed):
    allocator, stub = cjk
    responses = list(stub.Generate(pb.GenerateRequest(
        text="中文很好 😀", sampling=sampling(48, n=2, temperature=1.0, seed=seed)),
        timeout=120))
    for choice in per_choice(responses).values():
        streamed = "".join(choice["text"])
        assert streamed == cjk_tokenizer.decode(choice["ids"], skip_special_tokens=True)
        assert any(ord(char) >= 0x2E80 for char in streamed), "multi-byte text came out"
    assert len(responses) > 10, "the text arrived in many deltas"
    wait_for(lambda: used_blocks(allocator) == 0)
