"""What the iteration benchmark runs: the presets (full, --quick), the contenders (engine
configurations compared side by side) and the requests of one batch."""
from __future__ import annotations

import random
from dataclasses import dataclass

from executor_service.engine.build import EngineOptions

SEED = 20240917

# Each contender: a label and the EngineOptions keyword overrides it runs with, on top of
# BASE_OPTIONS. The first one is the reference the others' ratios are taken against. Adding a
# configuration to compare is one line here; `--contenders` picks which of them run.
CONTENDERS: dict[str, dict] = {
    # The protocol before sparse Steps: an Append per running sequence per iteration.
    "per-token": {"sparse_steps": False},
    # Sparse Steps (the default): a decoding sequence appends once per block.
    "sparse": {},
}

# What every contender shares: the embedded model in float32 on the CPU, the default cache
# (256 MiB: 131,072 tokens of the embedded model, far more than 256 sequences of ~100 tokens
# need, so nothing is preempted), block size 16, 256 sequences and 2,048 tokens per iteration.
BASE_OPTIONS: dict = {"device": "cpu", "dtype": "float32"}


def engine_options(overrides: dict) -> EngineOptions:
    return EngineOptions(**{**BASE_OPTIONS, **overrides})


@dataclass(frozen=True, slots=True)
class Settings:
    name: str
    # Decoding sequences per iteration, one measurement each.
    batch_sizes: tuple[int, ...]
    # Decode iterations timed per run, after `warm_iterations` untimed ones.
    iterations: int
    warm_iterations: int
    # Every contender runs every batch size this many times, the order rotating.
    rounds: int
    # Prompt lengths, uniform in [low, high].
    prompt_low: int = 16
    prompt_high: int = 32

    @property
    def max_tokens(self) -> int:
        """Output tokens per request: enough that none finishes while timed (each also gets its
        first token from its prefill, and the run aborts them all afterwards)."""
        return self.warm_iterations + self.iterations + 8


FULL = Settings("full", batch_sizes=(1, 16, 64, 256), iterations=50, warm_iterations=3,
                rounds=3)
QUICK = Settings("quick", batch_sizes=(1, 4), iterations=5, warm_iterations=1, rounds=1)


def draw_prompts(settings: Settings, batch_size: int, token_ids: list[int]) -> list[list[int]]:
    """The batch's prompts: the same for every contender and round of a batch size (each run
    has its own cache salt, so no run finds another's prompts cached)."""
    rng = random.Random(SEED + batch_size)
    return [[token_ids[rng.randrange(len(token_ids))]
             for _ in range(rng.randint(settings.prompt_low, settings.prompt_high))]
            for _ in range(batch_size)]
