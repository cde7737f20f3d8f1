"""What the sharing benchmark serves: its presets (full and --quick), the two kinds of case, and
what each case submits with sharing and without.

    parallel sampling, n = k   R prompts, k sampled completions of each.
        shared:      one request per prompt with SamplingParams(n=k): the engine computes the
                     prompt once and forks the k - 1 other choices from its blocks (the full
                     blocks stay shared; the partial last block is copied when first written).
        not shared:  k requests of n = 1 per prompt, each with a cache salt of its own, so
                     neither fork nor the prefix cache shares a block.
    shared system prompt       R requests, one common system prompt + a user part of their own.
        shared:      one cache salt for all: the prefix cache serves the system prompt's blocks
                     to every request admitted after the first ones computed it.
        not shared:  a cache salt per request: every request computes and holds its own copy.

Both modes of a case ask for the same output tokens. Prompts are random ordinary token ids
(bench/throughput/workload.py), parallel sampling prompts chat-like in length (CHAT_PROMPTS). Salts
carry a per-run tag as well, so no run finds what an earlier run left in the prefix cache.

Each sampled request gets a seed, and choice j of a shared request draws with child_seed(seed, j)
(sampler.py); the unshared twin of choice j is given that same seed, so both modes draw the same
random numbers and, on batch-invariant logits, the same tokens.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from allocator_service.core.executor_pool import blocks_for
from bench.throughput.workload import CHAT_PROMPTS, SEED, LogNormalLengths, random_prompt
from executor_service.engine.sampler import child_seed
from pagedserve.protocol.sampling_params import SamplingParams

BLOCK_SIZE = 16
PARALLEL, SYSTEM = "parallel sampling", "shared system prompt"


@dataclass(frozen=True, slots=True)
class Settings:
    name: str
    # Parallel sampling: prompts per n, the n's, prompt lengths.
    sampling_requests: int
    sampling_n: tuple[int, ...]
    prompt_lens: LogNormalLengths
    # Shared system prompt: requests, its length (a multiple of the block size, so every one
    # of its blocks can be shared), the user parts' lengths.
    system_requests: int
    system_prompt_len: int
    user_lens: LogNormalLengths
    # Output tokens of every sequence, end-of-sequence ignored.
    output_len: int
    # The KV cache in blocks of BLOCK_SIZE: enough that no run preempts (a sanity row checks),
    # so blocks in use measure sharing and nothing else.
    num_blocks: int
    max_batched_tokens: int
    # Each mode of each case runs this many times, alternating; the fastest run counts.
    rounds: int


USER_PARTS = LogNormalLengths(median=64, sigma=0.5, low=8, high=256)

# 8,192 blocks of the embedded model (4 layers x 2 x 16 slots x 2 KV heads x 32 dims x 4 bytes
# = 32 KiB each) is 256 MiB, the CPU default; the largest peak of any run is about 2,600.
FULL = Settings("full", sampling_requests=32, sampling_n=(2, 4, 6), prompt_lens=CHAT_PROMPTS,
                system_requests=64, system_prompt_len=512, user_lens=USER_PARTS, output_len=64,
                num_blocks=8192, max_batched_tokens=2048, rounds=2)
QUICK = Settings("quick", sampling_requests=4, sampling_n=(2,), prompt_lens=CHAT_PROMPTS,
                 system_requests=4, system_prompt_len=64,
                 user_lens=LogNormalLengths(median=16, sigma=0.5, low=4, high=32), output_len=8,
                 num_blocks=1024, max_batched_tokens=64, rounds=1)


@dataclass(frozen=True, slots=True)
class Submission:
    prompt: list[int]
    params: SamplingParams
    cache_salt: str


@dataclass(frozen=True, slots=True)
class ParallelSampling:
    n: int
    prompts: list[list[int]]
    seeds: list[int]
    output_len: int

    kind = PARALLEL

    @property
    def label(self) -> str:
        return f"parallel sampling n={self.n}"

    def submissions(self, shared: bool, tag: str) -> list[Submission]:
        """Shared: one n-choice request per prompt. Not shared: n single requests per prompt,
        in the order of the shared choices (prompt i choice j is entry i * n + j)."""
        if shared:
            return [Submission(prompt, self._params(self.n, seed), f"{tag}-fork")
                    for prompt, seed in zip(self.prompts, self.seeds)]
        return [Submission(prompt, self._params(1, child_seed(seed, j)), f"{tag}-nofork-{i}-{j}")
                for i, (prompt, seed) in enumerate(zip(self.prompts, self.seeds))
                for j in range(self.n)]

    def _params(self, n: int, seed: int) -> SamplingParams:
        return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=self.output_len,
                              ignore_eos=True)

    def expected_peak_saving(self, output_len: int | None = None) -> float:
        """Share of the unshared blocks that fork can save once every sequence is at full
        length (`output_len` tokens, default the case's): the n - 1 extra copies of each
        prompt's full blocks, over n sequences' blocks."""
        output_len = self.output_len if output_len is None else output_len
        saved = sum((self.n - 1) * (len(p) // BLOCK_SIZE) for p in self.prompts)
        return saved / sum(self.n * blocks_for(len(p) + output_len, BLOCK_SIZE) for p in self.prompts)


@dataclass(frozen=True, slots=True)
class SharedSystemPrompt:
    system: list[int]
    users: list[list[int]]
    output_len: int

    kind = SYSTEM
    n = 1

    @property
    def label(self) -> str:
        return f"shared system prompt ({len(self.system)} tokens)"

    @property
    def prompts(self) -> list[list[int]]:
        return [self.system + user for user in self.users]

    def submissions(self, shared: bool, tag: str) -> list[Submission]:
        """Greedy, so both modes must produce the same tokens."""
        params = SamplingParams(temperature=0, max_tokens=self.output_len, ignore_eos=True)
        return [Submission(prompt, params, f"{tag}-system" if shared else f"{tag}-own-{i}")
                for i, prompt in enumerate(self.prompts)]

    def expected_peak_saving(self, output_len: int | None = None) -> float:
        """Upper bound: every request but one served the system prompt's full blocks from the
        cache (the requests admitted with the first ones compute their own copy)."""
        output_len = self.output_len if output_len is None else output_len
        saved = (len(self.users) - 1) * (len(self.system) // BLOCK_SIZE)
        return saved / sum(blocks_for(len(p) + output_len, BLOCK_SIZE) for p in self.prompts)


Case = ParallelSampling | SharedSystemPrompt


def draw_cases(settings: Settings, token_ids: list[int], seed: int = SEED) -> list[Case]:
    """One parallel sampling case per n (the same prompts for every n), then the system prompt."""
    rng = random.Random(seed)
    lengths = settings.prompt_lens.draw(settings.sampling_requests, rng)
    prompts = [random_prompt(token_ids, length, rng) for length in lengths]
    seeds = [rng.randrange(2 ** 62) for _ in prompts]
    cases: list[Case] = [ParallelSampling(n, prompts, seeds, settings.output_len)
                         for n in settings.sampling_n]
    system = random_prompt(token_ids, settings.system_prompt_len, rng)
    users = [random_prompt(token_ids, length, rng)
             for length in settings.user_lens.draw(settings.system_requests, rng)]
    cases.append(SharedSystemPrompt(system, users, settings.output_len))
    return cases
