"""What the memory benchmark replays: the presets (full and --quick) and the requests they draw.

Lengths are drawn like ShareGPT conversations, the chat traffic the vLLM paper measures its
memory claims on (Kwon et al., SOSP 2023, §6.1 and Fig. 11: ShareGPT averages about 161 input
and 338 output tokens, both long-tailed). We do not have the data set here, so we draw from
log-normals chosen to have those means: prompts median 110, σ 0.9, outputs median 260, σ 0.8,
each clipped to [4, 1024] (means before the small clip loss: 165 and 357; after it about 161 and
337). Prompt plus output is then at most 2,048 tokens: the maximum model length, which is what
the contiguous scheme reserves per request. The report prints what was actually drawn (median,
mean, p90).

Every request arrives at t = 0 (a saturated server) with its own random prompt, so no prefix is
shared and no prefix-cache hit blurs what each request costs; one completion each (n = 1), its
output length fixed in advance (end-of-sequence ignored), so every scheme computes exactly the
same tokens.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from bench.throughput.workload import LogNormalLengths

SEED = 20240917


@dataclass(frozen=True, slots=True)
class Settings:
    name: str
    num_requests: int
    prompt_lens: LogNormalLengths
    output_lens: LogNormalLengths
    # The context window: what the contiguous scheme reserves for every request.
    max_model_len: int
    # The KV cache every scheme gets, in token slots.
    budget_slots: int
    # Block sizes of the paged runs; the headline one carries the targets.
    block_sizes: tuple[int, ...]
    headline_block_size: int = 16
    # The engine's per-iteration token budget (chunked prefill); the simulator uses it too.
    max_batched_tokens: int = 2048
    # Slots the engine reserves ahead of the token it writes (EngineOptions' default).
    lookahead_slots: int = 4
    vocab_size: int = 128
    target_paged_share: float = 0.96
    target_concurrency_ratio: float = 3.0


SHAREGPT_PROMPTS = LogNormalLengths(median=110, sigma=0.9, low=4, high=1024)
SHAREGPT_OUTPUTS = LogNormalLengths(median=260, sigma=0.8, low=4, high=1024)

# 800 requests keep the paged cache saturated for well over a thousand iterations at block 16
# (the contiguous scheme, at 32 requests at a time, for several thousand).
FULL = Settings("full", num_requests=800, prompt_lens=SHAREGPT_PROMPTS,
                output_lens=SHAREGPT_OUTPUTS, max_model_len=2048, budget_slots=65536,
                block_sizes=(8, 16, 32, 64, 128, 256))
# The same shape, shrunk: a context window of 256, room for 4 of them. Its requests are so
# short that a part-filled block and the lookahead weigh far more: its block-16 share
# falls short of the full run's target, which is not what --quick checks.
QUICK = Settings("quick", num_requests=100,
                 prompt_lens=LogNormalLengths(median=20, sigma=0.9, low=4, high=128),
                 output_lens=LogNormalLengths(median=40, sigma=0.8, low=4, high=128),
                 max_model_len=256, budget_slots=1024, block_sizes=(16, 64))


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def prompt_lens(self) -> list[int]:
        return [len(prompt) for prompt in self.prompts]


def draw_workload(settings: Settings, seed: int = SEED) -> Workload:
    """The requests, in arrival order: token ids uniform over the vocabulary."""
    rng = random.Random(seed)
    prompt_lens = settings.prompt_lens.draw(settings.num_requests, rng)
    output_lens = settings.output_lens.draw(settings.num_requests, rng)
    prompts = [[rng.randrange(settings.vocab_size) for _ in range(length)]
               for length in prompt_lens]
    return Workload(prompts, output_lens)

