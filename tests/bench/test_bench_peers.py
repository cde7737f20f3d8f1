"""The peer benchmark's parts that need no vLLM: the parser of `vllm bench serve`'s saved JSON
(vLLM 0.32's field names), the `## Peers` tables and plot from fabricated results, the mid-size
checkpoint writer (shrunk), the dist-info the install writes, the client's command line and the
alternating order. The whole benchmark (`make bench-peers`) installs vLLM and is not a test."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
from pathlib import Path

from bench.peers import checkpoint, install
from bench.peers import report as peers_report
from bench.peers.__main__ import round_order
from bench.peers.client import BenchResult, ClientSettings, bench_command, parse_result
from bench.peers.plot import write_plot
from bench.peers.report import Agreement, Results, Run, WorkloadResult
from bench.peers.stacks import PAGEDSERVE, VLLM

# What vLLM 0.32's `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py: the
# result dict, then mean/median/std/pN per metric of --percentile-metrics), trimmed.
SAVED = {
    "date": "20261125-040000", "endpoint_type": "openai", "backend": "openai", "label": None,
    "model_id": "peers-embedded", "tokenizer_id": "/models/x", "num_prompts": 32,
    "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 8,
    "duration": 1.25, "completed": 32, "failed": 0, "total_input_tokens": 4096,
    "total_output_tokens": 2048, "request_throughput": 25.6, "request_goodput": None,
    "output_throughput": 1638.4, "total_token_throughput": 4915.2,
    "max_output_tokens_per_s": 2100.0, "max_concurrent_requests": 8, "rtfx": 0.0,
    "mean_ttft_ms": 60.5, "median_ttft_ms": 58.0, "std_ttft_ms": 9.0, "p50_ttft_ms": 58.0,
    "p90_ttft_ms": 80.0, "p99_ttft_ms": 240.0,
    "mean_tpot_ms": 3.2, "median_tpot_ms": 3.1, "std_tpot_ms": 0.4, "p50_tpot_ms": 3.1,
    "p90_tpot_ms": 4.0, "p99_tpot_ms": 5.3,
    "mean_itl_ms": 2.8, "median_itl_ms": 0.002, "std_itl_ms": 20.0, "p50_itl_ms": 0.002,
    "p90_itl_ms": 0.004, "p99_itl_ms": 140.0,
}


def bench_result(throughput: float, ttft: float, tpot: float, itl: float,
                 failed: int = 0) -> BenchResult:
    def stats(median: float) -> dict[str, float]:
        return {"mean": median * 1.1, "median": median, "p50": median, "p90": median * 2,
                "p99": median * 4}

    return BenchResult(duration_s=2048 / throughput, completed=32 - failed, failed=failed,
                       total_output_tokens=2048, request_throughput=throughput / 64,
                       output_throughput=throughput,
                       latency_ms={"ttft": stats(ttft), "tpot": stats(tpot), "itl": stats(itl)})


def fabricated() -> Results:
    workload = WorkloadResult("embedded", "tiny (the embedded default)", 3_000_000, 262,
                              Agreement(7, 8, 32))
    workload.runs = [
        Run(PAGEDSERVE, 0, 0, bench_result(1000, 100, 6, 5)),
        Run(VLLM, 0, 1, bench_result(2000, 50, 3, 0.001)),
        Run(VLLM, 1, 0, bench_result(2400, 40, 2, 0.001)),
        Run(PAGEDSERVE, 1, 1, bench_result(1200, 120, 4, 4, failed=1)),
    ]
    server = {"block_size": 32, "kv_cache_gib": 1, "max_num_seqs": 256,
              "max_num_batched_tokens": 2048, "dtype": "float32"}
    return Results(ClientSettings(num_prompts=32, max_concurrency=8), server, 2, "0.32.0+cpu",
                   [workload])


def test_parse_result_reads_the_fields_vllm_0_32_saves() -> None:
    result = parse_result(json.loads(json.dumps(SAVED)))
    assert result.output_throughput == 1638.4
    assert result.request_throughput == 25.6
    assert (result.completed, result.failed, result.total_output_tokens) == (32, 0, 2048)
    assert result.duration_s == 1.25
    assert result.latency_ms["ttft"] == {"mean": 60.5, "median": 58.0, "p50": 58.0,
                                         "p90": 80.0, "p99": 240.0}
    assert result.latency_ms["tpot"]["p99"] == 5.3
    assert result.latency_ms["itl"]["median"] == 0.002
    assert BenchResult.from_json(result.to_json()) == result


def test_report_tables_give_medians_over_rounds_and_the_ratio() -> None:
    results = fabricated()
    header, rows = peers_report.workload_grid(results.workloads[0])
    assert header == ["metric (median over rounds)", "pagedserve", "vLLM", "pagedserve / vLLM"]
    assert rows == [
        ["output tokens/s", "1,100", "2,200", "0.50"],
        ["requests/s", "17.19", "34.38", "0.50"],
        ["TTFT median (ms)", "110.0", "45.0", "2.44"],
        ["TTFT p99 (ms)", "440.0", "180.0", "2.44"],
        ["TPOT median (ms)", "5.0", "2.5", "2.00"],
        ["TPOT p99 (ms)", "20.0", "10.0", "2.00"],
        # vLLM's ITL is about 0 (tokens read together): no ratio.
        ["ITL median (ms)", "4.5", "0.0", "—"],
        ["ITL p99 (ms)", "18.0", "0.0", "—"],
        ["output tokens/s, every round", "1,000 / 1,200", "2,000 / 2,400", "—"],
        ["failed requests, all rounds", "1", "0", "—"],
    ]
    assert peers_report.agreement_line(results.workloads[0]) == (
        "Greedy agreement: 7 of 8 prompts got the same text from both (32 tokens each, "
        "temperature 0).")
    assert peers_report.ratio_lines(results) == [
        "`embedded`: pagedserve / vLLM output tokens/s: 0.50"]


def test_section_plot_and_json_from_fabricated_results(tmp_path: Path) -> None:
    results = fabricated()
    png, md = tmp_path / "img" / "peers.png", tmp_path / "benchmarks.md"
    write_plot(results, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    body = peers_report.section_body(results, png, md)
    assert "Method and reading: [Peers: how it is measured](#peers-how-it-is-measured)." in body
    assert "### `embedded`: tiny (the embedded default), 3.0M parameters, vocabulary 262" in body
    assert "| output tokens/s | 1,100 | 2,200 | 0.50 |" in body
    assert "- **`embedded`: pagedserve / vLLM output tokens/s: 0.50**" in body
    assert "![peer benchmark](img/peers.png)" in body
    assert "vLLM 0.32.0+cpu" in body and "Each contender served each workload twice" in body
    assert "validation run" not in body
    results.quick = True
    assert "**A validation run (--quick" in peers_report.section_body(results, png, md)
    path = peers_report.write_json(results, tmp_path / "raw")
    again = peers_report.from_json(json.loads(path.read_text()))
    assert again == results


def test_client_command_is_the_reference_measurement(tmp_path: Path) -> None:
    command = bench_command(Path("/peer"), "http://127.0.0.1:9", "peers-mid", Path("/m"),
                            ClientSettings(), seed=2, result_dir=tmp_path, filename="r.json")
    text = " ".join(command)
    assert command[:3] == ["/peer/bin/vllm", "bench", "serve"]
    for flags in ("--backend openai", "--endpoint /v1/completions", "--dataset-name random",
                  "--random-input-len 128", "--random-output-len 64", "--num-prompts 384",
                  "--max-concurrency 64", "--request-rate inf", "--ignore-eos",
                  "--temperature 0", "--seed 2", "--model peers-mid", "--tokenizer /m",
                  "--save-result", f"--result-dir {tmp_path}", "--result-filename r.json"):
        assert flags in text, flags


def test_rounds_alternate_who_goes_first() -> None:
    assert [round_order(i) for i in range(3)] == [(PAGEDSERVE, VLLM), (VLLM, PAGEDSERVE),
                                                  (PAGEDSERVE, VLLM)]


def test_vllm_metadata_answers_for_the_vllm_distribution(tmp_path: Path) -> None:
    install.write_vllm_metadata(tmp_path)
    [dist] = list(importlib.metadata.distributions(path=[str(tmp_path)]))
    assert dist.metadata["Name"] == "vllm"
    assert dist.version == "0.32.0+cpu"
    assert sorted(path.name for path in (tmp_path / "vllm-0.32.0+cpu.dist-info").iterdir()) == [
        "INSTALLER", "METADATA", "RECORD"]
    assert not install.is_installed(tmp_path)


def test_mid_checkpoint_loads_and_its_tokenizer_covers_every_id(tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoConfig

    from executor_service.model.model_config import ModelConfig
    from executor_service.model.tokenizer_files import load_tokenizer_files

    assert 50e6 <= checkpoint.RECIPE.num_parameters() <= 100e6
    small = dataclasses.replace(checkpoint.RECIPE, hidden_size=32, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=16, intermediate_size=64)
    directory = checkpoint.checkpoint_dir(small, root=tmp_path)
    assert checkpoint.checkpoint_dir(small, root=tmp_path) == directory   # cached
    config = AutoConfig.from_pretrained(directory)
    assert (config.model_type, config.vocab_size) == ("llama", 32000)
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)
    assert ModelConfig.from_dir(directory).vocab_size == 32000
    load_tokenizer_files(directory, 32000)      # pagedserve's executor accepts it
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"]) == ("<s>", "</s>")

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 32000
    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(32000)]
    assert all(texts) and len(set(texts)) == 32000
    ordinary = list(range(3, 32000))
    assert tokenizer.encode(tokenizer.decode(ordinary), add_special_tokens=False).ids == ordinary
