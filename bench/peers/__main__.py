"""Peer benchmark: pagedserve against vLLM (its CPU build) on the same checkpoints, measured by
the same client, vLLM's own `vllm bench serve`.

    .venv/bin/python -m bench.peers                   # both workloads, 3 rounds (make bench-peers)
    .venv/bin/python -m bench.peers --quick           # smoke run; writes nothing unless told
    .venv/bin/python -m bench.peers --install-only    # only install the peer into .venv-peer/

The peer is installed on first use into a venv of its own (install.py; `.venv-peer/`). Per
workload both servers are started on free loopback ports and stay up: `pagedserve up --model
DIR` (allocator, executor, gateway; its OpenAI HTTP API) and `vllm serve DIR`, with the same
served model name, dtype, block size, KV cache and limits (stacks.py). First the same greedy
prompts go to both and their texts are compared (also a warm-up); then each round runs the
client once against each, the order alternating from round to round, each round with its own
dataset seed (client.py). Workloads: `embedded` (pagedserve's embedded default, 2M parameters,
262 tokens: the serving overhead dominates) and `mid` (a 64M-parameter Llama with a 32k
vocabulary, checkpoint.py: the matmuls dominate).

Writes the `## Peers` section of docs/benchmarks.md (report.py) and docs/img/peers_bench.png
(plot.py); `--results-dir` also keeps peers_bench.json, every client's saved JSON and the logs.
Not part of `make bench` or `make test`: `make bench-peers`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from bench.peers import install
from bench.peers import report as peers_report
from bench.peers.client import ClientSettings, agreement_prompts, greedy_texts, run_bench
from bench.peers.plot import write_plot
from bench.peers.report import Agreement, Results, Run, WorkloadResult
from bench.peers.stacks import (CONTENDERS, PAGEDSERVE, VLLM, PagedserveServer, ServerSettings,
                                VllmServer)
from bench.peers.workloads import WORKLOADS, parse_workloads, workload_model
from bench.report import add_output_flags, output_paths, publish, with_overrides


@dataclass(frozen=True, slots=True)
class Preset:
    client: ClientSettings
    rounds: int
    workloads: tuple[str, ...]


FULL = Preset(ClientSettings(num_prompts=384, max_concurrency=64), rounds=3, workloads=WORKLOADS)
QUICK = Preset(ClientSettings(num_prompts=32, max_concurrency=8), rounds=1,
               workloads=("embedded",))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers",
                                     description=__doc__.splitlines()[0])
    add_output_flags(parser)
    parser.add_argument("--workloads", type=parse_workloads, default=None,
                        help="comma-separated, of: embedded, mid (default: both; --quick: "
                             "embedded)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="client runs per contender and workload, alternating (default 3)")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="requests per client run (default 384)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="requests open at once at most (default 64)")
    parser.add_argument("--input-len", type=int, default=None, help="prompt tokens (128)")
    parser.add_argument("--output-len", type=int, default=None, help="output tokens (64)")
    parser.add_argument("--kv-cache-gib", type=int, default=1,
                        help="each server's KV cache, GiB (vLLM: VLLM_CPU_KVCACHE_SPACE)")
    parser.add_argument("--agreement-prompts", type=int, default=8,
                        help="greedy prompts sent to both to compare their texts")
    parser.add_argument("--agreement-tokens", type=int, default=32,
                        help="tokens generated per greedy prompt")
    parser.add_argument("--peer-venv", type=Path, default=install.DEFAULT_VENV,
                        help="where the peer is installed (default .venv-peer/)")
    parser.add_argument("--install-only", action="store_true",
                        help="install the peer (if needed) and stop")
    parser.add_argument("--reinstall-peer", action="store_true",
                        help="install the peer even if its marker says it is there")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also keep peers_bench.json, the client's JSON files and the "
                             "servers' and client's logs there")
    return parser.parse_args(argv)


def preset_from(args: argparse.Namespace) -> Preset:
    preset = QUICK if args.quick else FULL
    client = with_overrides(preset.client, num_prompts=args.num_prompts,
                            max_concurrency=args.max_concurrency, input_len=args.input_len,
                            output_len=args.output_len)
    return with_overrides(preset, client=client, rounds=args.rounds, workloads=args.workloads)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    venv = install.install(args.peer_venv, force=args.reinstall_peer)
    if args.install_only:
        return 0
    preset = preset_from(args)
    out_md, out_png = output_paths(args, "peers_bench.png")
    # SIGTERM unwinds like Ctrl-C, so both servers are always stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with tempfile.TemporaryDirectory(prefix="pagedserve-peers-") as scratch:
        work = args.results_dir or Path(scratch)
        print(f"logs and client results: {work}", file=sys.stderr)
        results = measure(preset, venv, args, work)
    print(peers_report.terminal_text(results))
    publish("Peers", results, peers_report, write_plot, args.results_dir, out_png, out_md)
    failed = sum(run.result.failed for w in results.workloads for run in w.runs)
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
    return 1 if failed else 0


def measure(preset: Preset, venv: Path, args: argparse.Namespace, work: Path) -> Results:
    base = ServerSettings(Path("."), "", kv_cache_gib=args.kv_cache_gib)
    server = {key: value for key, value in dataclasses.asdict(base).items()
              if key not in ("model_dir", "served_name", "startup_timeout_s")}
    vllm_version = json.loads((venv / install.MARKER).read_text())["vllm"]
    results = Results(preset.client, server, preset.rounds, vllm_version, quick=args.quick)
    total = len(preset.workloads) * preset.rounds * len(CONTENDERS)
    with tqdm(total=total, unit="run", file=sys.stderr, desc="peers") as progress:
        for name in preset.workloads:
            results.workloads.append(
                measure_workload(name, preset, venv, args, base, work, progress))
    return results


def measure_workload(name: str, preset: Preset, venv: Path, args: argparse.Namespace,
                     base: ServerSettings, work: Path, progress: tqdm) -> WorkloadResult:
    model_dir, model = workload_model(name)
    config = json.loads((model_dir / "config.json").read_text())
    settings = dataclasses.replace(base, model_dir=model_dir, served_name=f"peers-{name}")
    result = WorkloadResult(name, model, count_parameters(model_dir), config["vocab_size"])
    progress.set_description(f"{name}: starting pagedserve")
    with PagedserveServer(settings) as ours:
        progress.set_description(f"{name}: starting vLLM (compiles the model)")
        with VllmServer(settings, venv, work / f"{name}-vllm-serve.log") as theirs:
            servers = {PAGEDSERVE: ours.base_url, VLLM: theirs.base_url}
            progress.set_description(f"{name}: greedy agreement")
            prompts = agreement_prompts(model_dir, args.agreement_prompts, 16)
            texts = {contender: greedy_texts(url, settings.served_name, prompts,
                                             args.agreement_tokens)
                     for contender, url in servers.items()}
            same = sum(a == b for a, b in zip(texts[PAGEDSERVE], texts[VLLM]))
            result.agreement = Agreement(same, len(prompts), args.agreement_tokens)
            (work / f"{name}-greedy.json").write_text(json.dumps(
                {"prompts": prompts, "texts": texts}, indent=1) + "\n")
            for round_index in range(preset.rounds):
                for position, contender in enumerate(round_order(round_index)):
                    progress.set_description(
                        f"{name}: round {round_index + 1}/{preset.rounds}: {contender}")
                    outcome = run_bench(
                        venv, servers[contender], settings.served_name, model_dir,
                        preset.client, seed=round_index, result_dir=work,
                        filename=f"{name}-{contender}-round{round_index}.json",
                        log_path=work / f"{name}-client.log")
                    result.runs.append(Run(contender, round_index, position, outcome))
                    progress.update()
    return result


def round_order(round_index: int) -> tuple[str, ...]:
    """Who goes first alternates: a shared machine's slow phases fall on both in turn."""
    return CONTENDERS if round_index % 2 == 0 else CONTENDERS[::-1]


def count_parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as weights:
            for key in weights.keys():  # noqa: SIM118 - safe_open has no __iter__
                total += _numel(weights.get_slice(key).get_shape())
    return total


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


if __name__ == "__main__":
    sys.exit(main())
