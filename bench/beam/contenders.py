"""The beam-search contenders, each running the same requests (prompts of token ids, width k,
all k hypotheses returned, a fixed output length with end-of-sequence ignored) and timed from
the first request sent to the last hypothesis back.

- pagedserve: its OpenAI HTTP API (`pagedserve up`: allocator, executor and gateway), the
  requests sent all at once as vLLM's server takes beam search (`use_beam_search`, `n` as the
  width); its engine batches the beams of every request and shares their blocks.
- vLLM: the same requests to `vllm serve`'s OpenAI API, whose beam search runs above its engine
  as a loop of one-token requests per beam (sharing through its prefix cache).
- transformers, batched: one `generate(num_beams=k, num_return_sequences=k)` over all requests
  at once (the prompts have one length, so nothing is padded): its best case.
- transformers, one by one: the same call per request, as a plain server loop makes it.
"""
from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

PAGEDSERVE, VLLM = "pagedserve", "vllm"
HF_BATCHED, HF_SEQUENTIAL = "transformers-batched", "transformers-one-by-one"
CONTENDERS = (PAGEDSERVE, VLLM, HF_BATCHED, HF_SEQUENTIAL)
LABELS = {PAGEDSERVE: "pagedserve", VLLM: "vLLM", HF_BATCHED: "transformers, batched",
          HF_SEQUENTIAL: "transformers, one by one"}


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[list[int]]
    width: int
    max_tokens: int

    @property
    def expected_tokens(self) -> int:
        return len(self.prompts) * self.width * self.max_tokens


@dataclass(slots=True)
class Timing:
    wall_s: float
    # Tokens of the returned hypotheses (every one of them, as usage counts them).
    output_tokens: int


def over_http(base_url: str, model: str, workload: Workload, timeout_s: float = 1800
              ) -> Timing:
    """Every request at once, each on its own connection, whole (not streamed)."""
    def one(prompt: list[int]) -> int:
        response = httpx.post(f"{base_url}/v1/completions", timeout=timeout_s, json=dict(
            model=model, prompt=prompt, max_tokens=workload.max_tokens, n=workload.width,
            use_beam_search=True, temperature=0, ignore_eos=True))
        response.raise_for_status()
        body = response.json()
        if len(body["choices"]) != workload.width:
            raise RuntimeError(f"{base_url} returned {len(body['choices'])} hypotheses, not "
                               f"{workload.width}")
        return body["usage"]["completion_tokens"]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(workload.prompts)) as pool:
        tokens = sum(pool.map(one, workload.prompts))
    return Timing(time.perf_counter() - start, tokens)


class Transformers:
    """The checkpoint loaded once into this process, float32, in eval mode."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(self, prompts: list[list[int]], width: int, max_tokens: int) -> int:
        """Returned tokens: exactly max_tokens per hypothesis (no end-of-sequence token)."""
        from transformers import GenerationConfig

        config = GenerationConfig(num_beams=width, num_return_sequences=width, do_sample=False,
                                  max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                  eos_token_id=None, pad_token_id=0, early_stopping=False,
                                  length_penalty=1.0)
        ids = torch.tensor(prompts)
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                      generation_config=config)
        generated = out.shape[1] - ids.shape[1]
        if out.shape[0] != len(prompts) * width or generated != max_tokens:
            raise RuntimeError(f"transformers returned {tuple(out.shape)}")
        return out.shape[0] * generated

    def batched(self, workload: Workload) -> Timing:
        start = time.perf_counter()
        tokens = self.generate(workload.prompts, workload.width, workload.max_tokens)
        return Timing(time.perf_counter() - start, tokens)

    def one_by_one(self, workload: Workload) -> Timing:
        start = time.perf_counter()
        tokens = sum(self.generate([prompt], workload.width, workload.max_tokens)
                     for prompt in workload.prompts)
        return Timing(time.perf_counter() - start, tokens)
