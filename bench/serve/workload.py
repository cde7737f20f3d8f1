"""What the serving benchmark sends: the presets (CPU, --quick, --gpu), the requests they draw
and when each request arrives.

Prompts are random ordinary token ids with chat-like lengths (bench/throughput/workload.py says why
log-normal, median 100, clipped to [8, 1024]); outputs have a length per request and ignore
end-of-sequence, so every contender computes exactly the same tokens. Prompts go as token ids,
so no tokenizer stands between the gateway and the in-process engine.

Arrivals follow vLLM's `benchmark_serving`: at rate ∞ every request arrives at once; at a finite
rate the gaps between arrivals are exponential (a Poisson process) with that mean. Either way at
most `max_concurrency` requests are open at a time, and a request that arrives while all slots
are taken waits for one (its latencies start when it is sent, as vLLM's do).
"""
from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from bench.throughput.workload import (CHAT_PROMPTS, SEED, LogNormalLengths, UniformLengths,
                                       Workload, draw_workload, fixed)

MiB = 1024 ** 2
GiB = 1024 ** 3
INFINITE = math.inf


@dataclass(frozen=True, slots=True)
class ServeSettings:
    name: str
    num_requests: int
    prompt_lens: LogNormalLengths | UniformLengths
    output_lens: UniformLengths
    # Requests per second; INFINITE sends them all at once (up to the concurrency cap).
    request_rates: tuple[float, ...]
    # Requests open at once at most, for every contender: the "64 concurrent streams".
    max_concurrency: int
    device: str
    dtype: str
    # The same engine on both sides: in-process and behind the executor.
    kv_cache_bytes: int
    max_batched_tokens: int
    max_num_seqs: int
    # Each contender runs the headline rate this many times, interleaved, and the best run
    # counts; every other rate once (a latency profile at a fixed load is not a best-of
    # quantity, and one round of each keeps the run within minutes).
    rounds: int
    # The stack over the in-process engine, output tokens/s at the headline rate.
    target_ratio: float = 0.80

    @property
    def headline_rate(self) -> float:
        """Where the target is judged: ∞ (as many streams as the cap allows), else the
        highest rate given."""
        return INFINITE if INFINITE in self.request_rates else max(self.request_rates)

    def rounds_at(self, rate: float) -> int:
        return self.rounds if rate == self.headline_rate else 1


# At 64 open requests the in-process engine serves about 2,000 output tokens/s on 2 CPU cores
# and the stack about 1,450; a request here averages 80 output tokens and 165 prompt tokens, so
# they saturate near 25 and 18 requests a second. 6 and 12 requests/s are light and moderate
# load, where latency rather than throughput tells the contenders apart.
CPU = ServeSettings("cpu", num_requests=192, prompt_lens=CHAT_PROMPTS,
                    output_lens=UniformLengths(32, 128), request_rates=(INFINITE, 12.0, 6.0),
                    max_concurrency=64, device="cpu", dtype="float32",
                    kv_cache_bytes=256 * MiB, max_batched_tokens=2048, max_num_seqs=256,
                    rounds=3)
QUICK = ServeSettings("quick", num_requests=8, prompt_lens=CHAT_PROMPTS, output_lens=fixed(8),
                      request_rates=(INFINITE,), max_concurrency=4, device="cpu",
                      dtype="float32", kv_cache_bytes=64 * MiB, max_batched_tokens=2048,
                      max_num_seqs=256, rounds=1)
# On a GPU the engine is fast and the gateway's per-token Python shows: longer outputs, higher
# rates. The KV cache is given explicitly: the executor would otherwise take 90 % of the GPU,
# and the in-process engine shares it.
GPU = ServeSettings("gpu", num_requests=256, prompt_lens=CHAT_PROMPTS,
                    output_lens=UniformLengths(64, 256), request_rates=(INFINITE, 32.0, 16.0),
                    max_concurrency=64, device="cuda", dtype="bfloat16",
                    kv_cache_bytes=8 * GiB, max_batched_tokens=8192, max_num_seqs=256,
                    rounds=2)


def draw_requests(settings: ServeSettings, token_ids: list[int], seed: int = SEED) -> Workload:
    """The requests every contender serves, at every rate: the throughput benchmark's draw
    (it reads only the count and the two length distributions)."""
    return draw_workload(settings, token_ids, seed)


def arrival_times(count: int, rate: float, seed: int = SEED) -> list[float]:
    """Seconds after the start at which each request arrives; all 0 at rate ∞."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(f"{seed}-{rate}")
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def rate_label(rate: float) -> str:
    return "∞" if math.isinf(rate) else f"{rate:g}"


def parse_rates(text: str) -> tuple[float, ...]:
    """`inf,8,4` -> (inf, 8.0, 4.0); argparse shows the error's message."""
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        rates = ()
    if not rates or any(not rate > 0 for rate in rates):
        raise argparse.ArgumentTypeError(
            f"request rates are positive numbers or inf, comma-separated; got {text!r}")
    return rates
