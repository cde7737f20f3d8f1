"""What one simulated executor serves: a seeded stream of requests shaped like chat traffic.

- Arrivals are Poisson, at the rate that keeps about `target_running` sequences running
  (Little's law: rate = running / (sequences per request x mean output tokens x iteration time)),
  with a first burst that fills the batch, so the executor reaches its steady state in seconds.
- Prompt and output lengths are log-normal (bench/throughput/workload.py's `LogNormalLengths`),
  shaped like ShareGPT's as the vLLM paper reports them (Kwon et al., SOSP 2023, §6.1: mean
  input 161 and mean output 338 tokens): prompts as the throughput benchmark draws them
  (median 100, σ 1, mean about 165), outputs with median 250 and σ 0.8 (mean about 344).
- A share of requests start with one of a few system prompts, which the prefix cache shares.
- A share ask for n > 1 choices (the allocator forks them and copies on write).
- A share are cancelled part way through their output.

Token ids are random: the allocator hashes them and never looks at what they mean.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from bench.throughput.workload import LogNormalLengths


@dataclass(frozen=True, slots=True)
class FleetWorkload:
    target_running: int = 256
    iteration_s: float = 0.020
    prompt_lengths: LogNormalLengths = LogNormalLengths(100, 1.0, 8, 1024)
    output_lengths: LogNormalLengths = LogNormalLengths(250, 0.8, 8, 2048)
    # Share of requests behind one of `num_system_prompts` shared prefixes.
    system_prompt_share: float = 0.5
    num_system_prompts: int = 8
    system_prompt_lengths: LogNormalLengths = LogNormalLengths(256, 0.5, 64, 1024)
    # Share of requests with n > 1, and the n they ask for.
    fanout_share: float = 0.05
    fanout_choices: tuple[int, ...] = (2, 4)
    cancel_share: float = 0.05
    vocab_size: int = 32_000
    # Share of target_running admitted in the first burst.
    initial_fill: float = 0.9

    @property
    def mean_output_tokens(self) -> float:
        lengths = self.output_lengths
        return lengths.median * math.exp(lengths.sigma ** 2 / 2)

    @property
    def mean_sequences(self) -> float:
        mean_n = sum(self.fanout_choices) / len(self.fanout_choices)
        return 1 + self.fanout_share * (mean_n - 1)

    @property
    def arrival_rate(self) -> float:
        """Requests per second that keep about target_running sequences busy."""
        lifetime_s = self.mean_output_tokens * self.iteration_s
        return self.target_running / (self.mean_sequences * lifetime_s)

    def describe(self) -> str:
        return (f"Poisson arrivals at {self.arrival_rate:.1f} requests/s (about "
                f"{self.target_running} running), prompts {self.prompt_lengths.describe()}, "
                f"outputs {self.output_lengths.describe()}; "
                f"{self.system_prompt_share:.0%} behind one of {self.num_system_prompts} system "
                f"prompts, {self.fanout_share:.0%} with n in {list(self.fanout_choices)}, "
                f"{self.cancel_share:.0%} cancelled part way")


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    n: int = 1
    # Cancelled once it has this many output tokens; None: runs to max_tokens.
    cancel_after: int | None = None


def draw_requests(workload: FleetWorkload, duration_s: float, seed: int) -> list[SimRequest]:
    """Every request arriving in [0, duration_s), in arrival order."""
    rng = random.Random(seed)
    # The system prompts are the fleet's: every executor (any seed) shares the same ones.
    shared = random.Random(0)
    system_prompts = [random_tokens(shared, length, workload.vocab_size) for length in
                      workload.system_prompt_lengths.draw(workload.num_system_prompts, shared)]
    burst = round(workload.target_running * workload.initial_fill / workload.mean_sequences)
    times = [0.0] * burst
    now = 0.0
    while True:
        now += rng.expovariate(workload.arrival_rate)
        if now >= duration_s:
            break
        times.append(now)
    requests = []
    for arrival in times:
        (prompt_len,) = workload.prompt_lengths.draw(1, rng)
        (output_len,) = workload.output_lengths.draw(1, rng)
        prompt = random_tokens(rng, prompt_len, workload.vocab_size)
        if rng.random() < workload.system_prompt_share:
            prompt = rng.choice(system_prompts) + prompt
        n = rng.choice(workload.fanout_choices) if rng.random() < workload.fanout_share else 1
        cancel = rng.randrange(1, output_len) if output_len > 1 and \
            rng.random() < workload.cancel_share else None
        requests.append(SimRequest(arrival, tuple(prompt), output_len, n, cancel))
    return requests


def random_tokens(rng: random.Random, count: int, vocab_size: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(count)]
