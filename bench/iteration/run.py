"""One measurement: a batch of requests brought to steady decode in one engine, then a number of
its iterations timed phase by phase (probe.py)."""
from __future__ import annotations

from dataclasses import dataclass

from bench.iteration.probe import Iteration, Recorder, probed
from bench.iteration.workload import Settings
from executor_service.engine.engine import Engine
from executor_service.engine.request import SequenceStatus
from pagedserve.protocol.sampling_params import SamplingParams

# Iterations allowed to bring a batch to steady decode (prefill of 256 short prompts takes a
# few) and to drain it afterwards.
MAX_SETTLE_STEPS = 1_000


@dataclass(slots=True)
class Run:
    """One contender's timed iterations at one batch size, in one round."""
    iterations: list[Iteration]
    # Decodes that waited for the Step's answer (scheduler.num_stalls), and preemptions, over
    # the timed iterations.
    stalls: int
    preemptions: int
    # Sequences decoding in every timed iteration (the batch size, unless something was off).
    decoding: int


def all_decoding(engine: Engine, request_ids: list[str]) -> bool:
    return all(seq.status is SequenceStatus.RUNNING and seq.is_decoding
               for request_id in request_ids
               for seq in engine.requests[request_id].sequences)


def measure_batch(engine: Engine, prompts: list[list[int]], settings: Settings,
                  tag: str) -> Run:
    """Submits `prompts` (greedy, end-of-sequence ignored), steps until every sequence decodes,
    runs the warm iterations, times `settings.iterations` more, then aborts the requests and
    steps until their blocks are freed. `tag` names the requests and salts their prefix cache."""
    params = SamplingParams(temperature=0, max_tokens=settings.max_tokens, ignore_eos=True)
    request_ids = [f"{tag}-{index}" for index in range(len(prompts))]
    for request_id, prompt in zip(request_ids, prompts):
        engine.add_request(request_id, prompt, params, cache_salt=tag)
    for _ in range(MAX_SETTLE_STEPS):
        if all_decoding(engine, request_ids):
            break
        engine.step()
    else:
        raise RuntimeError(f"{tag}: the batch was not decoding after {MAX_SETTLE_STEPS} steps")
    for _ in range(settings.warm_iterations):
        engine.step()
    if not all_decoding(engine, request_ids):
        raise RuntimeError(f"{tag}: a request stopped decoding before the timed iterations")

    scheduler = engine.scheduler
    stalls, preemptions = scheduler.num_stalls, scheduler.num_preemptions
    recorder = Recorder()
    with probed(engine, recorder):
        for _ in range(settings.iterations):
            engine.step()
    run = Run(recorder.iterations, scheduler.num_stalls - stalls,
              scheduler.num_preemptions - preemptions,
              len(request_ids) if all_decoding(engine, request_ids) else -1)

    for request_id in request_ids:
        if request_id in engine.requests:
            engine.abort(request_id)
    for _ in range(MAX_SETTLE_STEPS):
        if not engine.has_work():
            break
        engine.step()
    else:
        raise RuntimeError(f"{tag}: the aborted batch was not drained after {MAX_SETTLE_STEPS} "
                           "steps")
    return run
