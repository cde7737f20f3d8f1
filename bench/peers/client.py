"""The one client both contenders get: vLLM's own `vllm bench serve` from the peer's venv, run
against a server's base URL, its result read back from the JSON it saves (`--save-result`).

    vllm bench serve --backend openai --base-url URL --endpoint /v1/completions
        --model NAME --tokenizer DIR --dataset-name random --random-input-len 128
        --random-output-len 64 --num-prompts 384 --max-concurrency 64 --request-rate inf
        --ignore-eos --temperature 0 --seed ROUND
        --percentile-metrics ttft,tpot,itl --metric-percentiles 50,90,99
        --save-result --result-dir DIR --result-filename FILE

Also the greedy-agreement check: the same prompts (token ids) to both servers' completions API
at temperature 0, end-of-sequence ignored, comparing the texts they return.
"""
from __future__ import annotations

import json
import random
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.peers.install import peer_env, vllm_command

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl")


@dataclass(frozen=True, slots=True)
class ClientSettings:
    num_prompts: int = 384
    max_concurrency: int = 64
    input_len: int = 128
    output_len: int = 64


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What one `vllm bench serve` run measured (times in ms)."""
    duration_s: float
    completed: int
    failed: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    # metric ("ttft", "tpot", "itl") -> {"mean", "median", "p50", "p90", "p99"} in ms.
    latency_ms: dict[str, dict[str, float]]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BenchResult:
        return cls(**data)


def bench_command(venv: Path, base_url: str, model: str, tokenizer: Path,
                  settings: ClientSettings, seed: int, result_dir: Path, filename: str
                  ) -> list[str]:
    return [str(vllm_command(venv)), "bench", "serve", "--backend", "openai",
            "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(settings.input_len),
            "--random-output-len", str(settings.output_len),
            "--num-prompts", str(settings.num_prompts),
            "--max-concurrency", str(settings.max_concurrency), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--seed", str(seed),
            "--percentile-metrics", ",".join(METRICS),
            "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
            "--save-result", "--result-dir", str(result_dir), "--result-filename", filename,
            "--disable-tqdm"]


def run_bench(venv: Path, base_url: str, model: str, tokenizer: Path, settings: ClientSettings,
              seed: int, result_dir: Path, filename: str, log_path: Path) -> BenchResult:
    """One client run; its output goes to `log_path`, its result to result_dir/filename."""
    command = bench_command(venv, base_url, model, tokenizer, settings, seed, result_dir,
                            filename)
    result_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(command) + "\n").encode())
        log.flush()
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=peer_env(),
                              stdin=subprocess.DEVNULL).returncode
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"vllm bench serve against {base_url} failed ({code}):\n{tail}")
    return parse_result(json.loads((result_dir / filename).read_text()))


def parse_result(data: dict) -> BenchResult:
    """The fields of a saved `vllm bench serve` result (vLLM 0.32's names) we report."""
    latency = {}
    for metric in METRICS:
        latency[metric] = {"mean": float(data[f"mean_{metric}_ms"]),
                           "median": float(data[f"median_{metric}_ms"]),
                           **{f"p{p}": float(data[f"p{p}_{metric}_ms"]) for p in PERCENTILES
                              if f"p{p}_{metric}_ms" in data}}
    return BenchResult(
        duration_s=float(data["duration"]), completed=int(data["completed"]),
        failed=int(data.get("failed", 0)), total_output_tokens=int(data["total_output_tokens"]),
        request_throughput=float(data["request_throughput"]),
        output_throughput=float(data["output_throughput"]), latency_ms=latency)


# -- greedy agreement -------------------------------------------------------------------------

def agreement_prompts(model_dir: Path, count: int, length: int, seed: int = 7
                      ) -> list[list[int]]:
    """`count` prompts of `length` token ids, drawn among the model's ordinary tokens (for a
    byte-level vocabulary, printable ASCII)."""
    from bench.throughput.workload import ordinary_token_ids

    ordinary = ordinary_token_ids(model_dir)
    if len(ordinary) <= 256:
        ordinary = [i for i in ordinary if 0x20 <= i < 0x7F]
    rng = random.Random(seed)
    return [[rng.choice(ordinary) for _ in range(length)] for _ in range(count)]


def greedy_texts(base_url: str, model: str, prompts: list[list[int]], max_tokens: int
                 ) -> list[str]:
    """Each prompt's greedy completion (temperature 0, end-of-sequence ignored), one at a time."""
    texts = []
    with httpx.Client(base_url=base_url, timeout=300.0) as http:
        for prompt in prompts:
            response = http.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True})
            response.raise_for_status()
            texts.append(response.json()["choices"][0]["text"])
    return texts
