"""One simulated executor: the real engine, scheduler and allocator client against a real
allocator service, with a forward pass that only waits (timed_pass.py) and random tokens
(random_sampler.py), serving a FleetWorkload. It records its Step stream (step_stream.py).

    python -m bench.fleet.sim_executor --target HOST:PORT --executor-id sim-0 \\
        --seconds 30 --iteration-ms 20 --out sim-0.stream

prints one JSON line: what it ran and how long it waited for the allocator.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.fleet.random_sampler import RandomSampler
from bench.fleet.recorder import RecordingAllocator
from bench.fleet.step_stream import StepStream
from bench.fleet.timed_pass import TimedForwardPass
from bench.fleet.workload import FleetWorkload, draw_requests
from executor_service.allocator_client import RemoteBlockAllocator
from executor_service.engine.engine import Engine
from executor_service.engine.scheduler import SchedulerConfig
from executor_service.heap import FullCollections, settle_startup_heap
from pagedserve.protocol.sampling_params import SamplingParams

# An 8B model's KV cache on an 80 GB GPU is about 20-25k blocks of 16 tokens (128 KiB a token).
DEFAULT_NUM_BLOCKS = 24_576
BLOCK_SIZE = 16
MAX_MODEL_LEN = 16_384
MAX_NUM_BATCHED_TOKENS = 2048
# The running sequences are counted every so many iterations (for the summary's mean): the
# simulator's own work is kept small, as its CPU per iteration is the Steps' slack at 5 ms.
RUNNING_SAMPLED_EVERY = 8


@dataclass(slots=True)
class SimSummary:
    executor_id: str
    seconds: float
    iterations: int
    steps: int
    ops: int
    requests_admitted: int
    sequences_finished: int
    mean_running: float
    # Overlapped Steps answered after their forward pass ended, and the time waited on them.
    stalls: int
    late_wait_s: float
    # Decoding sequences whose next slot was not reserved in time (the scheduler's count).
    slot_stalls: int
    # Time spent waiting for Steps the pass needed first (admissions, forks, copies).
    blocking_wait_s: float
    preemptions: int


def simulate(target: str, executor_id: str, workload: FleetWorkload, seconds: float, seed: int,
             *, num_blocks: int = DEFAULT_NUM_BLOCKS, step_interval: int = 1, reserve_blocks: int = 1,
             token: str = "",
             stream_path: Path | None = None) -> SimSummary:
    forward = TimedForwardPass(workload.iteration_s)
    stream = StepStream(executor_id, num_blocks, BLOCK_SIZE, "fleet-sim:bs16",
                        workload.iteration_s, seconds)
    client = RemoteBlockAllocator(target, executor_id, "127.0.0.1:0", token=token)
    recorder = RecordingAllocator(client, forward, stream)
    config = SchedulerConfig(BLOCK_SIZE, workload.target_running, MAX_NUM_BATCHED_TOKENS,
                             step_interval=step_interval, reserve_blocks=reserve_blocks)
    engine = Engine(forward, RandomSampler(workload.vocab_size, seed), recorder, config,
                    vocab_size=workload.vocab_size, max_model_len=MAX_MODEL_LEN,
                    eos_token_ids=())
    engine.register_pool(num_blocks, stream.model_fingerprint)
    requests = draw_requests(workload, seconds, seed)
    cancel_at: dict[str, int] = {}
    produced: dict[str, int] = {}
    next_request, admitted, finished, running_sum, running_samples = 0, 0, 0, 0, 0
    # As the executor process does once its engine is built (executor_service/__main__.py).
    settle_startup_heap()
    full_collections = FullCollections()
    start = time.monotonic()
    try:
        while (now := time.monotonic() - start) < seconds:
            while next_request < len(requests) and requests[next_request].arrival_s <= now:
                request = requests[next_request]
                request_id = f"{executor_id}-r{next_request}"
                engine.add_request(request_id, request.prompt_token_ids, SamplingParams(
                    n=request.n, max_tokens=request.max_tokens))
                if request.cancel_after is not None:
                    cancel_at[request_id] = request.cancel_after
                next_request += 1
                admitted += 1
            if not engine.has_work():
                upcoming = requests[next_request].arrival_s if next_request < len(requests) \
                    else seconds
                time.sleep(max(0.0, min(upcoming, seconds) - now))
                continue
            for output in engine.step():
                for delta in output.deltas:
                    finished += delta.finish_reason is not None
                request_id = output.request_id
                if request_id in cancel_at and not output.finished:
                    produced[request_id] = produced.get(request_id, 0) + max(
                        (len(delta.token_ids) for delta in output.deltas), default=0)
                    if produced[request_id] >= cancel_at[request_id]:
                        del cancel_at[request_id]
                        engine.abort(request_id)  # its outputs come with the next step's
            if engine.num_iterations % RUNNING_SAMPLED_EVERY == 0:
                running_sum += sum(len(r.sequences) for r in engine.scheduler.running)
                running_samples += 1
            full_collections.between_iterations()
        engine.settle()  # the last Step may still be out: its answer belongs in the stream
    finally:
        recorder.close()
    stream.num_iterations, stream.num_finished = engine.num_iterations, finished
    if stream_path is not None:
        stream.save(stream_path)
    return SimSummary(
        executor_id, round(time.monotonic() - start, 3), engine.num_iterations, engine.num_steps,
        sum(step.num_ops for step in stream.steps), admitted, finished,
        round(running_sum / max(1, running_samples), 1), recorder.stalls,
        round(recorder.late_wait_s, 4), engine.scheduler.num_stalls,
        round(recorder.blocking_wait_s, 4), engine.scheduler.num_preemptions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the allocator, host:port")
    parser.add_argument("--executor-id", required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--iteration-ms", type=float, default=20.0)
    parser.add_argument("--running", type=int, default=256, help="sequences kept running")
    parser.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS)
    parser.add_argument("--step-interval", type=int, default=1,
                        help="the executor's --step-interval (coalesced Steps)")
    parser.add_argument("--reserve-blocks", type=int, default=1,
                        help="the executor's --reserve-blocks (blocks an Append reserves ahead)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--token", default="", help="the allocator's bearer token, if any")
    parser.add_argument("--out", type=Path, help="write the Step stream here")
    args = parser.parse_args(argv)
    workload = FleetWorkload(target_running=args.running, iteration_s=args.iteration_ms / 1000)
    summary = simulate(args.target, args.executor_id, workload, args.seconds, args.seed,
                       num_blocks=args.num_blocks, step_interval=args.step_interval,
                       reserve_blocks=args.reserve_blocks, token=args.token, stream_path=args.out)
    print(json.dumps(asdict(summary)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
