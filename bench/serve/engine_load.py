"""The in-process contender: the executor's engine (`build_engine`, the allocator core in this
process) driven by a closed loop that serves the same arrival schedule under the same
concurrency cap as the gateway's clients, with no RPC, no tokenizer and no client in between.

The loop is the executor's serving loop without its queues: between two iterations it admits
every request that has arrived while fewer than `max_concurrency` are open, then steps the
engine once; each step's outputs are stamped when the step returns (sampling has read the tokens
back, so on a GPU too they exist by then). With nothing open it sleeps until the next arrival.
"""
from __future__ import annotations

import collections
import time
from pathlib import Path

from tqdm import tqdm

from allocator_service.local_block_allocator import LocalBlockAllocator
from bench.serve.metrics import RequestTrace
from bench.serve.workload import ServeSettings
from bench.throughput.workload import Workload
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.engine import Engine
from pagedserve.protocol.sampling_params import SamplingParams


class InProcessLoad:
    """`serve()` alike with the gateway's clients (gateway_load.py).

    The engine is built and stepped on this process's main thread, as the throughput benchmark
    and `offline.generate` run it, and no other thread of this process runs torch. On the CPU
    that matters: once a second thread runs torch's OpenMP regions while the first one that did
    is alive, libgomp has more workers than cores and stops spinning them, so every parallel
    region waits for a wake-up. An engine built on the main thread and stepped on another ran
    its decode steps 2-4× slower here. (The executor is not affected: the thread that loads
    its model exits before the engine's thread starts working; an A/B of the two arrangements
    measured the same.)"""

    def __init__(self, settings: ServeSettings, model_dir: Path) -> None:
        self.engine = build_in_process(settings, model_dir)
        self.max_concurrency = settings.max_concurrency

    def serve(self, workload: Workload, arrivals: list[float], cache_salt: str,
              progress: tqdm | None = None) -> tuple[list[RequestTrace], float, float]:
        return serve_in_process(self.engine, workload, arrivals, self.max_concurrency,
                                cache_salt, progress)

    def close(self) -> None:
        pass


def build_in_process(settings: ServeSettings, model_dir: Path) -> Engine:
    """The engine with the executor's settings (stack.executor_flags)."""
    return build_engine(model_dir, EngineOptions(
        device=settings.device, dtype=settings.dtype, block_size=16,
        kv_cache_memory=settings.kv_cache_bytes, max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_batched_tokens), LocalBlockAllocator())


def serve_in_process(engine: Engine, workload: Workload, arrivals: list[float],
                     max_concurrency: int, cache_salt: str, progress: tqdm | None = None
                     ) -> tuple[list[RequestTrace], float, float]:
    """Serves every request; returns the traces (in request order), the start and the end."""
    traces = [RequestTrace() for _ in workload.prompts]
    waiting = collections.deque(range(len(workload.prompts)))
    open_requests: dict[str, int] = {}
    start = time.perf_counter()
    end = start
    while waiting or open_requests:
        now = time.perf_counter()
        while waiting and len(open_requests) < max_concurrency \
                and start + arrivals[waiting[0]] <= now:
            index = waiting.popleft()
            request_id = f"{cache_salt}-{index}"
            params = SamplingParams(temperature=0, max_tokens=workload.output_lens[index],
                                    ignore_eos=True)
            engine.add_request(request_id, workload.prompts[index], params, cache_salt)
            open_requests[request_id] = index
            traces[index].sent_s = time.perf_counter()
        if not open_requests:
            time.sleep(max(0.0, start + arrivals[waiting[0]] - time.perf_counter()))
            continue
        outputs = engine.step()
        stamp = time.perf_counter()
        for output in outputs:
            trace = traces[open_requests[output.request_id]]
            for delta in output.deltas:
                trace.token_ids += delta.token_ids
                trace.arrivals.append((stamp, len(delta.token_ids)))
            if output.finished:
                del open_requests[output.request_id]
                trace.reported_tokens = len(trace.token_ids)
                trace.error = output.error or ""
                end = stamp
                if progress is not None:
                    progress.update(1)
    return traces, start, end
