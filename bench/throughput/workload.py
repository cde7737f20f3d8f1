"""What the throughput benchmark serves: the presets (CPU, --quick, --gpu), the requests they
draw, and the stand-in checkpoint of the --gpu preset.

Prompt lengths of the CPU presets are drawn like chat traffic: long-tailed, most prompts short
and a few long. The vLLM paper (Kwon et al., SOSP 2023, §6.1 and its Fig. 11) shows ShareGPT's
input and output lengths that way; we do not fit its numbers, we pick a log-normal with a
median of 100 tokens and σ = 1 (mean ≈ 165, p90 ≈ 360, p99 ≈ 1,024 tokens), clipped to
[8, 1024]. Outputs have a fixed length and ignore end-of-sequence, so every contender computes
exactly the same tokens.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

MiB = 1024 ** 2
GiB = 1024 ** 3
SEED = 20240917


@dataclass(frozen=True, slots=True)
class LogNormalLengths:
    median: int
    sigma: float
    low: int
    high: int

    def draw(self, count: int, rng: random.Random) -> list[int]:
        return [min(self.high, max(self.low, round(rng.lognormvariate(math.log(self.median),
                                                                     self.sigma))))
                for _ in range(count)]

    def describe(self) -> str:
        return (f"log-normal, median {self.median}, σ {self.sigma:g}, clipped to "
                f"[{self.low}, {self.high}]")


@dataclass(frozen=True, slots=True)
class UniformLengths:
    low: int
    high: int

    def draw(self, count: int, rng: random.Random) -> list[int]:
        return [rng.randint(self.low, self.high) for _ in range(count)]

    def describe(self) -> str:
        return f"{self.low}" if self.low == self.high else \
            f"uniform in [{self.low}, {self.high}]"


def fixed(length: int) -> UniformLengths:
    return UniformLengths(length, length)


@dataclass(frozen=True, slots=True)
class Settings:
    name: str
    num_requests: int
    prompt_lens: LogNormalLengths | UniformLengths
    output_lens: UniformLengths
    device: str
    dtype: str
    # Requests per padded batch of transformers' static `generate`.
    hf_batch: int
    # KV cache of both paged contenders (ours and generate_batch), so neither holds more tokens.
    kv_cache_bytes: int
    # Tokens per forward pass at most, for both paged contenders.
    max_batched_tokens: int
    # Each contender runs this many times, interleaved; the best run counts.
    rounds: int
    # Targets: ours / static generate and ours / generate_batch, in output tokens per second.
    target_vs_static: float
    target_vs_continuous: float


CHAT_PROMPTS = LogNormalLengths(median=100, sigma=1.0, low=8, high=1024)

# Static generate's batch: 16 was about the fastest on 2 CPU cores, on a draw of this workload
# (output tokens/s at batch 8 / 16 / 32 / 64 / 128: about 1,070 / 1,010-1,080 / 820-870 / 600 /
# 590). Bigger batches pad more, and a CPU has no idle lanes for them to fill.
CPU = Settings("cpu", num_requests=128, prompt_lens=CHAT_PROMPTS, output_lens=fixed(64),
               device="cpu", dtype="float32", hf_batch=16, kv_cache_bytes=256 * MiB,
               max_batched_tokens=2048, rounds=2, target_vs_static=1.5,
               target_vs_continuous=5.0)
QUICK = Settings("quick", num_requests=8, prompt_lens=CHAT_PROMPTS, output_lens=fixed(8),
                 device="cpu", dtype="float32", hf_batch=4, kv_cache_bytes=64 * MiB,
                 max_batched_tokens=2048, rounds=1, target_vs_static=1.5,
                 target_vs_continuous=5.0)
# The GPU workload. Static generate pads each batch to its longest prompt and generates
# up to its longest output; 64 requests per batch keep a 0.5B model's GPU busy.
GPU = Settings("gpu", num_requests=256, prompt_lens=UniformLengths(100, 1024),
               output_lens=UniformLengths(100, 1024), device="cuda", dtype="bfloat16",
               hf_batch=64, kv_cache_bytes=16 * GiB, max_batched_tokens=8192, rounds=1,
               target_vs_static=10.0, target_vs_continuous=2.0)


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)


def draw_workload(settings: Settings, token_ids: list[int], seed: int = SEED) -> Workload:
    """The requests of a run: token ids uniform over `token_ids`, lengths as configured."""
    rng = random.Random(seed)
    lengths = settings.prompt_lens.draw(settings.num_requests, rng)
    outputs = settings.output_lens.draw(settings.num_requests, rng)
    prompts = [random_prompt(token_ids, length, rng) for length in lengths]
    return Workload(prompts, outputs)


def warmup_workload(token_ids: list[int]) -> Workload:
    """A few short requests, run untimed before each contender: first calls, lazily faulted
    memory, Triton compilation. Another seed, so none of it can be a prefix cache hit later."""
    rng = random.Random(SEED + 1)
    prompts = [random_prompt(token_ids, rng.randint(16, 64), rng) for _ in range(4)]
    return Workload(prompts, [4] * len(prompts))


def random_prompt(token_ids: list[int], length: int, rng: random.Random) -> list[int]:
    return [token_ids[rng.randrange(len(token_ids))] for _ in range(length)]


def ordinary_token_ids(model_dir: Path) -> list[int]:
    """The vocabulary without its control tokens (bos, eos and pad from config.json, and the
    tokenizer's added tokens), so a prompt never holds one: 0..255 for the embedded model."""
    config = json.loads((model_dir / "config.json").read_text())
    special = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = config.get(key)
        special |= set(value) if isinstance(value, list) else {value}
    tokenizer = model_dir / "tokenizer.json"
    if tokenizer.exists():
        special |= {token["id"] for token in
                    json.loads(tokenizer.read_text()).get("added_tokens", [])}
    return [i for i in range(config["vocab_size"]) if i not in special]


# The --gpu preset's stand-in: Qwen2.5-0.5B's shape (its published config.json) with random
# weights. No checkpoint can be downloaded on the benchmark machines, and throughput depends on
# the shapes, not on what the weights say.
QWEN2_5_0_5B_SHAPE = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    bos_token_id=151643, eos_token_id=151643)


def write_gpu_stand_in(directory: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN2_5_0_5B_SHAPE),
                                             dtype=torch.bfloat16)
    model.save_pretrained(directory)
    return directory
