"""The executor end to end: a real allocator and a real executor process on loopback, the
embedded default model, a real gRPC Session stream."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.model.embedded import embedded_model_dir
from executor_service.model.tokenizer_files import load_tokenizer_files
from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc
from pagedserve.protocol.sampling_params import SamplingParams
from pagedserve.supervisor.service_process import AllocatorProcess, ExecutorProcess, pagedctl_audit
from tests.support.allocator_wire import used_blocks
from tests.support.executor_session import Stream, tokens_of
from tests.support.polling import wait_for


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[AllocatorProcess, ExecutorProcess, Path]]:
    cache = tmp_path_factory.mktemp("cache")
    with AllocatorProcess() as allocator:
        with ExecutorProcess("--allocator", allocator.target, "--num-blocks", "256",
                             env={"PAGEDSERVE_CACHE_DIR": str(cache)}) as executor:
            yield allocator, executor, cache


def test_streamed_greedy_tokens_equal_the_in_process_engine(stack):
    allocator, executor, cache = stack
    prompt = list(b"The quick brown fox jumps over")
    stream = Stream(executor)
    stream.submit("greedy", prompt, max_tokens=24, temperature=0, ignore_eos=True)
    updates = stream.until_finished("greedy")
    stream.close()
    assert len(updates) > 2, "tokens arrive as a stream, not in one piece"
    engine = build_engine(embedded_model_dir(cache), EngineOptions(num_blocks=64),
                          LocalBlockAllocator())
    (expected,) = generate(engine, [prompt], SamplingParams(temperature=0, max_tokens=24,
                                                            ignore_eos=True))
    assert tokens_of(updates) == expected.choices[0]
    last = updates[-1]
    assert last.completions[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), 24)


def test_cancel_mid_stream_frees_every_block(stack):
    allocator, executor, _ = stack
    stream = Stream(executor)
    stream.submit("long", list(b"a long story"), max_tokens=3000, ignore_eos=True, n=2)
    first = stream.updates.get(timeout=60)
    assert first.request_id == "long" and not first.finished
    stream.cancel("long")
    updates = stream.until_finished("long")
    stream.close()
    reasons = {c.index: c.finish_reason for u in updates for c in u.completions
               if c.finish_reason}
    assert reasons == {0: pb.FINISH_REASON_CANCELLED, 1: pb.FINISH_REASON_CANCELLED}
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout + audit.stderr


def test_a_stream_that_disappears_has_its_requests_cancelled(stack):
    allocator, executor, _ = stack
    stream = Stream(executor)
    stream.submit("orphan", list(b"nobody listens"), max_tokens=3000, ignore_eos=True)
    stream.updates.get(timeout=60)
    stream.call.cancel()  # the client goes away without a word
    wait_for(lambda: used_blocks(allocator) == 0)
    assert "no violations" in pagedctl_audit(allocator).stdout


def test_a_bad_submission_is_refused_on_the_stream_which_carries_on(stack):
    _, executor, _ = stack
    stream = Stream(executor)
    stream.submit("bad-token", [5, 99999])
    stream.submit("bad-temperature", [5], temperature=-1)
    stream.submit("fine", [5, 6], max_tokens=3, ignore_eos=True)
    for request_id, message in (("bad-token", "outside the vocabulary"),
                                ("bad-temperature", "temperature must be >= 0")):
        (refusal,) = stream.until_finished(request_id)
        assert refusal.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert message in refusal.error
    assert stream.until_finished("fine")[-1].usage.completion_tokens == 3
    stream.close()


def test_an_id_submitted_again_right_after_its_cancel_gets_its_own_answer(stack):
    allocator, executor, _ = stack
    stream = Stream(executor)
    stream.submit("again", list(b"first time"), max_tokens=3000, ignore_eos=True)
    stream.updates.get(timeout=60)
    # Both reach the engine's thread before its next iteration: the cancel's last update must
    # go out before the new request's first, or the new one is taken for the old one's end.
    stream.cancel("again")
    stream.submit("again", list(b"second time"), max_tokens=4, ignore_eos=True)
    first = stream.until_finished("again")
    assert first[-1].completions[-1].finish_reason == pb.FINISH_REASON_CANCELLED
    second = stream.until_finished("again")
    assert second[-1].completions[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert second[-1].usage.completion_tokens == 4
    stream.close()
    wait_for(lambda: used_blocks(allocator) == 0)


def test_get_info_describes_the_model_and_its_pool(stack):
    _, executor, _ = stack
    info = pb_grpc.ExecutorStub(executor.channel()).GetInfo(pb.GetInfoRequest())
    assert info.model_name == "pagedserve-embedded-llama"
    assert (info.vocab_size, info.block_size, info.num_blocks) == (262, 16, 256)
    assert list(info.eos_token_ids) == [257] and info.epoch >= 1


def test_get_tokenizer_sends_the_checkpoints_files_with_the_info_digest(stack):
    _, executor, cache = stack
    stub = pb_grpc.ExecutorStub(executor.channel())
    received: dict[str, bytes] = {}
    for chunk in stub.GetTokenizer(pb.GetTokenizerRequest()):
        received[chunk.file_name] = received.get(chunk.file_name, b"") + chunk.data
    expected = load_tokenizer_files(embedded_model_dir(cache), 262)
    assert received == expected.files
    assert stub.GetInfo(pb.GetInfoRequest()).tokenizer_digest == expected.digest

