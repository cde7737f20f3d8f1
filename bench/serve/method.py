"""The serving benchmark's own words for docs/benchmarks.md: what was sent, how the contenders
were set up and how each number is computed."""
from __future__ import annotations

import math
import os

from bench.report import drawn_lengths
from bench.serve.workload import ServeSettings, rate_label
from bench.throughput.workload import Workload


def rates_text(settings: ServeSettings) -> str:
    finite = [rate_label(rate) for rate in settings.request_rates if not math.isinf(rate)]
    parts = []
    if any(math.isinf(rate) for rate in settings.request_rates):
        parts.append("∞ (all at once)")
    if finite:
        parts.append(f"Poisson arrivals at {' and '.join(finite)} requests/s")
    return ", and ".join(parts)


def workload_text(s: ServeSettings, w: Workload) -> str:
    lengths = sorted(len(prompt) for prompt in w.prompts)
    return (
        f"{len(w.prompts)} requests at each request rate: {rates_text(s)}, at most "
        f"{s.max_concurrency} open at a time (a request that arrives while all are open waits "
        "for one, and its latencies start when it is sent). Prompt lengths "
        f"{s.prompt_lens.describe()} (drawn: {drawn_lengths(lengths)}; "
        f"{w.num_prompt_tokens:,} prompt tokens), token ids random among the model's ordinary "
        "tokens, sent as token ids so no tokenizer differs on the way in; output "
        f"{s.output_lens.describe()} tokens per request ({w.num_output_tokens:,} in all), "
        "greedy, end-of-sequence ignored. Every run has its own `cache_salt`: nothing comes "
        "from the prefix cache.")


def method_text(s: ServeSettings, model: str, device: str) -> list[str]:
    cores = os.cpu_count()
    return [
        f"Model `{model}`, {s.dtype}, on {device}. The stack: `python -m allocator_service`, "
        "one `python -m executor_service` and `python -m gateway` as child processes on "
        "loopback, with `pagedserve up`'s command lines; the executor's engine sends its block "
        "ops to the allocator over gRPC (one `Step` per iteration). The in-process engine is "
        "the same `build_engine` with the allocator core in its own process. Both engines: "
        f"block size 16, a KV cache of {s.kv_cache_bytes // 2**20:,} MiB, "
        f"{s.max_batched_tokens} tokens per iteration at most, {s.max_num_seqs} sequences at "
        f"most. The load generator is this script, on the same {cores} cores as the stack.",

        "Contenders, on the same requests, arrival times and cap: the in-process engine, "
        "driven on this script's main thread by a loop that admits arrived requests between "
        "iterations and stamps each step's tokens when the step returns; the gateway's gRPC "
        "`Generate` through grpc.aio, every stream on one channel; the gateway's HTTP "
        "`/v1/completions` with `\"stream\": true` through one httpx `AsyncClient` "
        "(server-sent events, `stream_options.include_usage`). Both clients run on one asyncio "
        "loop, the lightest load generator this process makes (the synchronous "
        f"`GatewayClient` on {s.max_concurrency} threads cost about 1.4× the CPU per token).",

        "Metrics, as vLLM's `benchmark_serving` defines them, from client-side timestamps of "
        "each piece of a stream (an engine step, a gRPC message, an HTTP event): duration from "
        "the first arrival to the last token; request throughput and output tokens/s over it; "
        "TTFT from sending a request to its first token; TPOT per request, (last token − first "
        "token) / (output tokens − 1); ITL one sample per token after the first, the gap since "
        "the previous piece shared evenly among the tokens of a piece (tokens that came with "
        "the first count 0), so a request's ITL samples average to its TPOT. Tokens are "
        "counted, not pieces: an HTTP event carries text only, and the gateway holds back a "
        "token whose text is an incomplete UTF-8 character, so each event's tokens are read "
        "off the same request's gRPC messages (one token each, same detokenizer); medians are "
        "`statistics.median`, p99 nearest-rank.",

        "Each contender is warmed up on 4 short requests first. Every contender serves rate "
        f"{rate_label(s.headline_rate)} {_times(s.rounds)}, the run with the most output "
        "tokens/s counting, and every other rate once; the order of the contenders rotates "
        "from run to run. Ratios are over the in-process engine at the same rate. CPU: user + "
        "system seconds each process used during that run (`/proc/PID/stat`), per output "
        "token (\"benchmark\" is this script: the clients in the stack's runs, the engine in "
        "the in-process ones); cores busy is all of them over the duration.",
    ]


def _times(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")
