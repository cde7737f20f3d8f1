"""The executor end to end: a real allocator and a real executor process on loopback, the
embedded default model, a real gRPC Session stream."""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from allocator_process import AllocatorProcess, ExecutorProcess, hermetic_env

from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.engine.sampling_params import SamplingParams
from executor_service.model.embedded import embedded_model_dir
from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.allocator.v1 import allocator_pb2_grpc as apb_grpc
from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[AllocatorProcess, ExecutorProcess, Path]]:
    cache = tmp_path_factory.mktemp("cache")
    with AllocatorProcess() as allocator:
        with ExecutorProcess("--allocator", allocator.target, "--num-blocks", "256",
                             env={"PAGEDSERVE_CACHE_DIR": str(cache)}) as executor:
            yield allocator, executor, cache


class Stream:
    """A Session: messages go up through a queue, updates come down in a thread."""

    def __init__(self, executor: ExecutorProcess) -> None:
        self.up: queue.Queue = queue.Queue()
        self.updates: queue.Queue = queue.Queue()
        self.call = pb_grpc.ExecutorStub(executor.channel()).Session(iter(self.up.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.call:
                for update in response.updates:
                    self.updates.put(update)
        except grpc.RpcError:
            pass

    def submit(self, request_id: str, prompt: list[int], **sampling) -> None:
        self.up.put(pb.SessionRequest(submit=pb.SubmitRequest(
            request_id=request_id, prompt_token_ids=prompt,
            sampling=pb.SamplingParams(**sampling))))

    def cancel(self, request_id: str) -> None:
        self.up.put(pb.SessionRequest(cancel=pb.CancelRequest(request_id=request_id)))

    def until_finished(self, request_id: str, timeout_s: float = 60) -> list:
        updates, deadline = [], time.monotonic() + timeout_s
        while True:
            update = self.updates.get(timeout=max(0.1, deadline - time.monotonic()))
            if update.request_id == request_id:
                updates.append(update)
                if update.finished:
                    return updates

    def close(self) -> None:
        self.up.put(None)
        self.call.cancel()


def used_blocks(allocator: AllocatorProcess) -> int:
    stats = apb_grpc.AllocatorAdminStub(allocator.channel()).GetStats(apb.GetStatsRequest())
    return stats.total.num_used_blocks


def pagedctl_audit(allocator: AllocatorProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedserve.cli.pagedctl", "--target",
                           allocator.target, "audit"], capture_output=True, text=True,
                          timeout=60, env=hermetic_env())


def tokens_of(updates: list, index: int = 0) -> list[int]:
    return [t for u in updates for c in u.completions if c.index == index for t in c.token_ids]


def test_streamed_greedy_tokens_equal_the_in_process_engine(stack):
    allocator, executor, cache = stack
    prompt = list(b"The quick brown fox jumps over")
    stream = Stream(executor)
    stream.submit("greedy", prompt, max_tokens=24, temperature=0, ignore_eos=True)
    updates = stream.until_finished("greedy")
    stream.close()
    assert len(updates) > 2, "tokens arrive as a stream, not in one piece"
    engine = build_engine(embedded_model_dir(cache), EngineOptions(num_blocks=64))
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


def test_get_info_describes_the_model_and_its_pool(stack):
    _, executor, _ = stack
    info = pb_grpc.ExecutorStub(executor.channel()).GetInfo(pb.GetInfoRequest())
    assert info.model_name == "pagedserve-embedded-llama"
    assert (info.vocab_size, info.block_size, info.num_blocks) == (262, 16, 256)
    assert list(info.eos_token_ids) == [257] and info.epoch >= 1


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
