"""Bad input to a real executor (real allocator, embedded model): a bad submission is refused on
its Session stream, by request id, with its status and a message naming the field; the stream,
and every other client's requests, carry on; afterwards nothing is left in the allocator."""
from __future__ import annotations

import queue

import grpc
import pytest
from grpc import StatusCode

from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import AllocatorProcess, ExecutorProcess, pagedctl_audit
from tests.support.allocator_wire import used_blocks
from tests.support.executor_session import Stream, tokens_of
from tests.support.oversized_messages import (OVERSIZED_CHARS, OVERSIZED_INPUT, OVERSIZED_MESSAGE,
                                              oversized_channel)
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(120)

# The KV cache has 32 blocks of 16 slots, 4 of which a sequence keeps reserved ahead: the
# executor serves a window of 508 tokens, not the embedded model's 4096.
NUM_BLOCKS = 32
WINDOW = NUM_BLOCKS * 16 - 4
PROMPT = (72, 105)
SESSION = "/pagedserve.executor.v1.Executor/Session"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with AllocatorProcess() as allocator, ExecutorProcess(
            "--allocator", allocator.target, "--num-blocks", str(NUM_BLOCKS),
            env={"PAGEDSERVE_CACHE_DIR": str(cache)}) as executor:
        yield allocator, executor


@pytest.fixture
def stream(stack):
    stream = Stream(stack[1])
    yield stream
    stream.close()


def submit(request_id: str = "bad", prompt: tuple[int, ...] = PROMPT, cache_salt: str = "",
           **sampling) -> pb.SubmitRequest:
    return pb.SubmitRequest(request_id=request_id, prompt_token_ids=prompt,
                            cache_salt=cache_salt, sampling=pb.SamplingParams(**sampling))


# (submission, status of the refusal, what its message must say)
SUBMISSIONS = {
    "empty prompt": (submit(prompt=()), StatusCode.INVALID_ARGUMENT,
                     "the prompt must hold at least one token"),
    "token id outside the vocabulary": (
        submit(prompt=(72, 9999)), StatusCode.INVALID_ARGUMENT,
        "prompt token 9999 is outside the vocabulary [0, 262)"),
    "negative token id": (submit(prompt=(-1,)), StatusCode.INVALID_ARGUMENT,
                          "prompt token -1 is outside the vocabulary"),
    "prompt over the context window": (
        submit(prompt=(72,) * WINDOW), StatusCode.INVALID_ARGUMENT,
        "the prompt has 508 tokens; the context window is 508, leaving no room to generate"),
    "prompt within the model's window that the KV cache cannot hold": (
        submit(prompt=(72,) * 1000), StatusCode.INVALID_ARGUMENT,
        "the prompt has 1000 tokens; the context window is 508"),
    "empty request_id": (submit(request_id=""), StatusCode.INVALID_ARGUMENT,
                         "request_id must be 1 to 252 characters (its sequence ids must fit "
                         "the allocator's 256), got 0"),
    "request_id of 300 characters": (submit(request_id="r" * 300), StatusCode.INVALID_ARGUMENT,
                                     "request_id must be 1 to 252 characters"),
    "request_id too long for its sequence ids": (
        submit(request_id="r" * 256), StatusCode.INVALID_ARGUMENT,
        "request_id must be 1 to 252 characters (its sequence ids must fit the allocator's "
        "256), got 256"),
    "cache_salt over the allocator's limit": (
        submit(cache_salt="s" * 257), StatusCode.INVALID_ARGUMENT,
        "cache_salt must be at most 256 characters, got 257"),
    "n huge": (submit(n=4_000_000_000), StatusCode.INVALID_ARGUMENT,
               "n must be between 1 and 128, got 4000000000"),
    "logprobs absurd": (submit(logprobs=1_000_000), StatusCode.INVALID_ARGUMENT,
                        "logprobs must be between 0 and 20, got 1000000"),
    "temperature NaN": (submit(temperature=float("nan")), StatusCode.INVALID_ARGUMENT,
                        "temperature must be >= 0, got nan"),
    "temperature infinite": (submit(temperature=float("inf")), StatusCode.INVALID_ARGUMENT,
                             "temperature must be <= 100, got inf"),
    "top_p 0": (submit(top_p=0), StatusCode.INVALID_ARGUMENT, "top_p must be in (0, 1], got 0"),
    "top_k past the vocabulary": (
        submit(top_k=10**9), StatusCode.INVALID_ARGUMENT,
        "top_k must be between 0 (off) and the vocabulary size 262, got 1000000000"),
    "min_p negative": (submit(min_p=-0.5), StatusCode.INVALID_ARGUMENT,
                       "min_p must be in [0, 1], got -0.5"),
    "seed over 2**63": (submit(seed=2**64 - 1), StatusCode.INVALID_ARGUMENT,
                        "seed must be between 0 and 2**63-1"),
    "repetition_penalty 0": (submit(repetition_penalty=0), StatusCode.INVALID_ARGUMENT,
                             "repetition_penalty must be in [0.01, 100], got 0"),
    "presence_penalty NaN": (submit(presence_penalty=float("nan")),
                             StatusCode.INVALID_ARGUMENT,
                             "presence_penalty must be in [-2, 2], got nan"),
    "stop token outside the vocabulary": (
        submit(stop_token_ids=[99999]), StatusCode.INVALID_ARGUMENT,
        "stop_token_ids must be in [0, 262), got 99999"),
}


@pytest.mark.parametrize("case", SUBMISSIONS)
def test_bad_submission_is_refused_by_request_id_naming_the_field(stream, case):
    request, status, message = SUBMISSIONS[case]
    stream.up.put(pb.SessionRequest(submit=request))
    (refusal,) = stream.until_finished(request.request_id, timeout_s=30)
    assert (refusal.error_code, list(refusal.completions)) == (status.value[0], [])
    assert message in refusal.error


def test_no_bad_submission_fails_another_clients_request(stack, stream):
    """The allocator refuses a Step whole: a submission it would refuse must not reach it."""
    bystander = Stream(stack[1])
    bystander.submit("bystander", list(PROMPT), max_tokens=60, ignore_eos=True, temperature=0)
    assert bystander.updates.get(timeout=60).request_id == "bystander"
    for request, _, _ in SUBMISSIONS.values():
        stream.up.put(pb.SessionRequest(submit=request))
    # Some are refused as they are read, others by the engine loop: the order may differ.
    errors = sorted(update.error for update in
                    (stream.updates.get(timeout=30) for _ in SUBMISSIONS) if update.finished)
    assert len(errors) == len(SUBMISSIONS)
    assert all(any(message in error for error in errors)
               for _, _, message in SUBMISSIONS.values())
    rest = bystander.until_finished("bystander")
    bystander.close()
    assert rest[-1].error == "" and rest[-1].usage.completion_tokens == 60
    assert rest[-1].completions[-1].finish_reason == pb.FINISH_REASON_LENGTH


# Where the answer to an input comes: a refusal on the stream, for its request id (the stream
# serves on), or the status that ends the call.
ON_STREAM, CALL_STATUS = "Session, on the stream", "Session, the call's status"

# Inputs that take more than one message, or that are no SubmitRequest:
# (where the answer comes, what is sent, status, what the answer says).
OTHER_CASES = {
    "request_id already running on this stream": (
        ON_STREAM, "submit 'dup', then 'dup' again while it runs", StatusCode.ALREADY_EXISTS,
        "request 'dup' is already running"),
    "request_id running on another stream": (
        ON_STREAM, "submit 'taken' on one stream, then on another", StatusCode.ALREADY_EXISTS,
        "request 'taken' is already running"),
    "cancel of an unknown request id": (
        ON_STREAM, "cancel 'nobody'", "ignored", "no update; the stream serves on"),
    "cancel of another stream's request": (
        ON_STREAM, "cancel 'mine', submitted on another stream", "ignored",
        "the owner's request runs to its max_tokens"),
    "SessionRequest with no kind": (ON_STREAM, "an empty SessionRequest",
                                    StatusCode.INVALID_ARGUMENT,
                                    "a SessionRequest must set submit or cancel"),
    "max_tokens past the window": (
        ON_STREAM, "500-token prompt, max_tokens 4000000000", "accepted",
        "FINISH_REASON_LENGTH at the window, after 12 tokens"),
    "Session message not UTF-8": (
        ON_STREAM, r"submit with request_id b'\xff\xfe'", StatusCode.INVALID_ARGUMENT,
        "a SessionRequest does not parse"),
    "Session message over the size limit": (
        CALL_STATUS, OVERSIZED_INPUT, StatusCode.RESOURCE_EXHAUSTED, OVERSIZED_MESSAGE),
    "GetInfo body that does not parse": (
        "GetInfo", r"b'\x08' (a truncated varint)", StatusCode.INVALID_ARGUMENT,
        "does not parse as its message"),
}


def refusal_of(case: str, update: pb.RequestUpdate) -> None:
    _, _, status, message = OTHER_CASES[case]
    assert (update.finished, update.error_code) == (True, status.value[0])
    assert message in update.error


def test_a_request_id_already_running_on_this_stream_is_refused_and_the_first_runs_on(stream):
    stream.submit("dup", list(PROMPT), max_tokens=30, ignore_eos=True)
    stream.updates.get(timeout=60)
    stream.submit("dup", list(PROMPT), max_tokens=3)
    *_, refusal = stream.until_finished("dup")
    refusal_of("request_id already running on this stream", refusal)
    rest = stream.until_finished("dup")
    assert rest[-1].error == "" and rest[-1].usage.completion_tokens == 30


def test_a_request_id_running_on_another_stream_is_refused(stack, stream):
    owner = Stream(stack[1])
    owner.submit("taken", list(PROMPT), max_tokens=30, ignore_eos=True)
    owner.updates.get(timeout=60)
    stream.submit("taken", list(PROMPT), max_tokens=3)
    (refusal,) = stream.until_finished("taken")
    refusal_of("request_id running on another stream", refusal)
    assert owner.until_finished("taken")[-1].usage.completion_tokens == 30
    owner.close()


def test_cancelling_an_unknown_request_is_ignored(stream):
    stream.cancel("nobody")
    stream.submit("after", list(PROMPT), max_tokens=2, ignore_eos=True)
    stream.until_finished("after")
    assert stream.updates.empty()


def test_cancelling_another_streams_request_is_ignored(stack, stream):
    owner = Stream(stack[1])
    owner.submit("mine", list(PROMPT), max_tokens=30, ignore_eos=True)
    owner.updates.get(timeout=60)
    stream.cancel("mine")
    updates = owner.until_finished("mine")
    owner.close()
    assert updates[-1].completions[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert updates[-1].usage.completion_tokens == 30
    assert stream.updates.empty()


def test_a_session_request_without_a_kind_is_refused_and_the_stream_goes_on(stream):
    stream.up.put(pb.SessionRequest())
    refusal_of("SessionRequest with no kind", stream.updates.get(timeout=30))
    stream.submit("next", list(PROMPT), max_tokens=2, ignore_eos=True)
    assert stream.until_finished("next")[-1].usage.completion_tokens == 2


def test_the_window_served_is_what_the_kv_cache_holds(stack):
    info = pb_grpc.ExecutorStub(stack[1].channel()).GetInfo(pb.GetInfoRequest(), timeout=10)
    assert (info.num_blocks, info.block_size, info.max_model_len) == (NUM_BLOCKS, 16, WINDOW)


def test_max_tokens_past_the_window_ends_at_the_window(stream):
    prompt = [72] * (WINDOW - 12)
    stream.submit("long", prompt, max_tokens=4_000_000_000, ignore_eos=True)
    updates = stream.until_finished("long")
    assert len(tokens_of(updates)) == 12
    assert updates[-1].completions[-1].finish_reason == pb.FINISH_REASON_LENGTH


def raw_session(channel: grpc.Channel, message: bytes) -> grpc.RpcError:
    call = channel.stream_stream(SESSION, request_serializer=lambda raw: raw,
                                 response_deserializer=pb.SessionResponse.FromString)
    with pytest.raises(grpc.RpcError) as caught:
        list(call(iter([message]), timeout=60))
    return caught.value


def test_a_session_message_that_is_not_utf8_is_refused_and_the_stream_goes_on(stack):
    up: queue.Queue = queue.Queue()
    call = stack[1].channel().stream_stream(
        SESSION, request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
        response_deserializer=pb.SessionResponse.FromString)(iter(up.get, None), timeout=60)
    # SessionRequest.submit (field 1) holding SubmitRequest.request_id (field 1) = ff fe.
    up.put(b"\x0a\x04\x0a\x02\xff\xfe")
    up.put(pb.SessionRequest(submit=submit(request_id="after-bad-bytes", max_tokens=2)))
    finished = []
    for response in call:
        finished += [update for update in response.updates if update.finished]
        if finished and finished[-1].request_id == "after-bad-bytes":
            break
    call.cancel()
    refusal_of("Session message not UTF-8", finished[0])
    assert "UTF-8" in finished[0].error
    assert finished[1].error == "" and finished[1].usage.completion_tokens == 2


def test_a_session_message_over_the_size_limit_is_resource_exhausted(stack):
    request = pb.SessionRequest(submit=submit(request_id="x" * OVERSIZED_CHARS))
    with oversized_channel(stack[1].target) as channel:
        error = raw_session(channel, request.SerializeToString())
    _, _, status, message = OTHER_CASES["Session message over the size limit"]
    assert error.code() == status and message in error.details()


def test_a_get_info_body_that_does_not_parse_is_invalid_argument(stack):
    get_info = stack[1].channel().unary_unary(
        "/pagedserve.executor.v1.Executor/GetInfo", request_serializer=lambda raw: raw,
        response_deserializer=pb.ExecutorInfo.FromString)
    with pytest.raises(grpc.RpcError) as caught:
        get_info(b"\x08", timeout=10)
    _, _, status, message = OTHER_CASES["GetInfo body that does not parse"]
    assert caught.value.code() == status and message in caught.value.details()


def test_after_all_that_the_executor_serves_and_nothing_leaked(stack, stream):
    allocator, executor = stack
    assert executor.process.poll() is None, executor.stderr_tail()
    stream.submit("still-here", list(PROMPT), max_tokens=5, ignore_eos=True)
    assert stream.until_finished("still-here")[-1].usage.completion_tokens == 5
    info = pb_grpc.ExecutorStub(executor.channel()).GetInfo(pb.GetInfoRequest(), timeout=10)
    assert (info.num_waiting, info.num_running) == (0, 0)
    wait_for(lambda: used_blocks(allocator) == 0)
    audit = pagedctl_audit(allocator)
    assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
    with pytest.raises(queue.Empty):
        stream.updates.get(timeout=0.5)
