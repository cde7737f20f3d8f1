"""An executor rides out its allocator's restart mid-stream, with real processes on loopback.

With Redis durability the allocator comes back holding the executor's pool and every sequence,
the executor's retried Step is answered, and the running streams carry on where they were.
Without it the allocator has forgotten the pool: the executor registers afresh and recomputes
its running requests. Either way each greedy stream ends with the tokens an undisturbed engine
gives, a request submitted during the outage is served after it, and no block leaks.
"""
from __future__ import annotations

import shutil
import time

import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.model.embedded import embedded_model_dir
from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.allocator.v1 import allocator_pb2_grpc as apb_grpc
from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc
from pagedserve.protocol.sampling_params import SamplingParams
from pagedserve.supervisor.redis_server import REDIS_SERVER
from pagedserve.supervisor.service_process import AllocatorProcess, ExecutorProcess, pagedctl_audit
from tests.support.allocator_wire import used_blocks
from tests.support.executor_session import Stream, tokens_of
from tests.support.polling import wait_for

PROMPTS = {"first": list(b"Once upon a time, in a paged cache far away,"),
           "second": list(b"The allocator fell over, and then"),
           "during-outage": list(b"submitted while nobody hands out blocks")}
MAX_TOKENS = 120


@pytest.mark.parametrize("durable", [
    pytest.param(True, id="durable", marks=pytest.mark.skipif(
        shutil.which(REDIS_SERVER) is None, reason="redis-server is not installed")),
    pytest.param(False, id="in-memory"),
])
def test_streams_finish_identically_across_an_allocator_kill(durable, tmp_path, request):
    state = ("--state-url", request.getfixturevalue("redis_server").url) if durable else ()
    cache = tmp_path / "cache"
    allocator = AllocatorProcess(*state)
    try:
        with ExecutorProcess("--allocator", allocator.target, "--num-blocks", "256",
                             env={"PAGEDSERVE_CACHE_DIR": str(cache)}) as executor:
            stream = Stream(executor)
            for request_id in ("first", "second"):
                stream.submit(request_id, PROMPTS[request_id], max_tokens=MAX_TOKENS,
                              temperature=0, ignore_eos=True)
            early = [stream.updates.get(timeout=60)]   # streaming has begun
            epoch = info(executor).epoch
            allocator.process.kill()
            allocator.stop()
            stream.submit("during-outage", PROMPTS["during-outage"], max_tokens=MAX_TOKENS,
                          temperature=0, ignore_eos=True)
            # Decoding runs on into the lookahead slots already granted, then waits.
            time.sleep(1.0)
            while not stream.updates.empty():
                early.append(stream.updates.get())
            assert not any(update.finished for update in early), "finished without allocator"
            allocator = AllocatorProcess(*state, "--port", str(allocator.port))

            streamed = stream.until_all_finished(PROMPTS, timeout_s=180)
            for update in reversed(early):
                streamed[update.request_id].insert(0, update)
            stream.close()
            engine = build_engine(embedded_model_dir(cache), EngineOptions(num_blocks=256),
                                  LocalBlockAllocator())
            expected = generate(engine, list(PROMPTS.values()),
                                SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                               ignore_eos=True))
            for request_id, completion in zip(PROMPTS, expected):
                updates = streamed[request_id]
                assert not updates[-1].error, updates[-1].error
                assert tokens_of(updates) == completion.choices[0], request_id

            executors = apb_grpc.AllocatorAdminStub(allocator.channel()).ListExecutors(
                apb.ListExecutorsRequest()).executors
            assert [e.executor_id for e in executors] == [info(executor).executor_id]
            if durable:   # the recovered pool, not a new registration
                assert info(executor).epoch == executors[0].epoch == epoch
            wait_for(lambda: used_blocks(allocator) == 0)
            audit = pagedctl_audit(allocator)
            assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
    finally:
        allocator.stop()


def info(executor: ExecutorProcess) -> pb.ExecutorInfo:
    return pb_grpc.ExecutorStub(executor.channel()).GetInfo(pb.GetInfoRequest())


@pytest.mark.skipif(shutil.which(REDIS_SERVER) is None, reason="redis-server is not installed")
def test_beam_search_ends_with_the_same_hypotheses_across_an_allocator_kill(tmp_path, request):
    """kill -9 of a durable allocator while beams fork and free every iteration: the executor
    retries its Steps against the recovered pool and the search returns the hypotheses, and
    scores, an undisturbed engine gives, with every block back and the audit clean."""
    state = ("--state-url", request.getfixturevalue("redis_server").url)
    cache = tmp_path / "cache"
    beam = dict(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, n=4, beam_width=4)
    allocator = AllocatorProcess(*state)
    try:
        with ExecutorProcess("--allocator", allocator.target, "--num-blocks", "256",
                             env={"PAGEDSERVE_CACHE_DIR": str(cache)}) as executor:
            stream = Stream(executor)
            stream.submit("beams", PROMPTS["first"], **beam)
            # A greedy neighbour streams, so its first token says the beams are decoding too.
            stream.submit("marker", PROMPTS["second"], max_tokens=MAX_TOKENS, temperature=0,
                          ignore_eos=True)
            while (first := stream.updates.get(timeout=60)).request_id != "marker":
                assert not first.finished, "the search ended before the allocator was killed"
            epoch = info(executor).epoch
            allocator.process.kill()
            allocator.stop()
            time.sleep(1.0)
            allocator = AllocatorProcess(*state, "--port", str(allocator.port))
            updates = stream.until_all_finished(["beams"], timeout_s=180)["beams"]
            stream.close()

            engine = build_engine(embedded_model_dir(cache), EngineOptions(num_blocks=256),
                                  LocalBlockAllocator())
            [expected] = generate(engine, [PROMPTS["first"]], SamplingParams(**beam))
            assert not updates[-1].error, updates[-1].error
            assert info(executor).epoch == epoch   # the recovered pool, not a new registration
            got = [tokens_of(updates, index) for index in range(4)]
            assert got == expected.choices
            scores = [c.score for u in updates for c in u.completions]
            assert scores == pytest.approx(expected.scores, rel=1e-5, abs=1e-4)
            wait_for(lambda: used_blocks(allocator) == 0)
            audit = pagedctl_audit(allocator)
            assert audit.returncode == 0 and "no violations" in audit.stdout, audit.stdout
    finally:
        allocator.stop()
