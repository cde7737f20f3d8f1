"""guidellm (0.8.1), the serving benchmark, run briefly against the gateway as its users run it:
`guidellm run` with the OpenAI HTTP backend (streamed chat completions, its default), synthetic
prompts of a fixed token count, a few synchronous requests, and a JSON report. Offline: the
synthetic text comes from its own generator and the tokenizer it counts prompt tokens with is the
served checkpoint's own files, so nothing is downloaded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.clients.live_stack import API_KEY, MODEL

REQUESTS = 5
PROMPT_TOKENS = 16
OUTPUT_TOKENS = 8


def test_a_short_synchronous_run_completes_every_request_with_our_token_counts(stack,
                                                                              tmp_path):
    report = tmp_path / "benchmarks.json"
    command = [
        str(Path(sys.executable).parent / "guidellm"), "run",
        "--backend", f"kind=openai_http,target={stack.gateway.http_url},model={MODEL},"
                     f"api_key={API_KEY}",
        "--profile", "kind=synchronous",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
                  f"output_tokens={OUTPUT_TOKENS}",
        "--tokenizer", f"kind=huggingface_auto,model={stack.model_dir}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets")}
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]

    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    assert benchmark["metrics"]["request_totals"] == {
        "successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}
    requests = benchmark["requests"]["successful"]
    assert len(requests) == REQUESTS
    for request in requests:
        body = json.loads(request["request_args"])["body"]
        # guidellm asks for exactly OUTPUT_TOKENS (max_completion_tokens with ignore_eos) and
        # takes the counts from our usage: the prompt's as /tokenize counts the conversation.
        assert body["max_completion_tokens"] == OUTPUT_TOKENS and body["ignore_eos"] is True
        prompt_tokens = stack.post("/tokenize", {"model": MODEL,
                                                 "messages": body["messages"]})["count"]
        assert request["input_metrics"]["text_tokens"] == prompt_tokens
        assert request["output_metrics"]["text_tokens"] == OUTPUT_TOKENS
        assert request["response_id"].startswith("chatcmpl-")
    totals = benchmark["metrics"]["output_token_count"]["successful"]
    assert totals["total_sum"] == REQUESTS * OUTPUT_TOKENS
