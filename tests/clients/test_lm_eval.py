"""lm-evaluation-harness (`lm_eval`, 0.4.13) against the gateway, run as its docs say to run it
on an OpenAI-compatible server: the CLI, `local-completions` with the server's own tokenizer
(`tokenizer_backend=remote`: /tokenize, /detokenize, /tokenizer_info), `--batch_size 4` (so
prompts go as batches of token-id lists), and `local-chat-completions` with
`--apply_chat_template`. Offline: the tasks are YAML files over local JSONL data.

Three kinds of task: generate_until (completions and chat), multiple_choice (loglikelihood of
each choice: `echo` with `logprobs`) and loglikelihood_rolling (perplexity). The model is random,
so the metrics are whatever they are; each is checked against what our API answers directly.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clients.live_stack import API_KEY, MODEL, LiveStack

GENERATE = [
    {"question": "The capital of France is", "answer": "Paris"},
    {"question": "Two plus two is", "answer": "four"},
    {"question": "The sky is", "answer": "blue"},
    {"question": "Cats say", "answer": "meow"},
    {"question": "Water is", "answer": "wet"},
]
# 9 choices in all: with --batch_size 4 the scoring requests go as batches of 4, 4 and 1.
MULTIPLE_CHOICE = [
    {"question": "The capital of France is", "choices": [" Paris", " London", " Rome"],
     "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " five", " three", " twenty-two"],
     "answer": 0},
    {"question": "The sky is", "choices": [" blue", " green"], "answer": 1},
]
PASSAGES = [
    {"text": "Paged attention stores the KV cache in fixed-size blocks."},
    {"text": "A block table maps each sequence's logical blocks to physical ones."},
]
MAX_GEN_TOKS = 8

TASKS = {
    "pagedserve_generate": ("generate.jsonl", GENERATE, """\
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: %d
  do_sample: false
metric_list:
  - metric: exact_match
""" % MAX_GEN_TOKS),
    "pagedserve_choice": ("choice.jsonl", MULTIPLE_CHOICE, """\
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""),
    "pagedserve_perplexity": ("passages.jsonl", PASSAGES, """\
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""),
}


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """The tasks as lm_eval's --include_path reads them: YAML over local JSONL files."""
    directory = tmp_path_factory.mktemp("lm_eval_tasks")
    for task, (data_file, rows, body) in TASKS.items():
        (directory / data_file).write_text("".join(json.dumps(row) + "\n" for row in rows))
        (directory / f"{task}.yaml").write_text(
            f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {directory / data_file}\ntest_split: test\n" + body)
    # The chat run reuses the generate task under a name of its own.
    chat = (directory / "pagedserve_generate.yaml").read_text().replace(
        "task: pagedserve_generate", "task: pagedserve_chat_generate")
    (directory / "pagedserve_chat_generate.yaml").write_text(chat)
    return directory


def run_lm_eval(stack: LiveStack, task_dir: Path, output: Path, *tasks: str,
                chat: bool = False) -> dict:
    """`lm_eval` as a user runs it against our server; returns its results JSON, with the
    per-sample records of each task under "samples"."""
    if chat:
        model, endpoint, extra = "local-chat-completions", "chat/completions", [
            "--apply_chat_template"]
        model_args = ""
    else:
        model, endpoint, extra = "local-completions", "completions", ["--batch_size", "4"]
        model_args = f",tokenizer_backend=remote,auth_token={API_KEY}"
    command = [str(Path(sys.executable).parent / "lm_eval"), "--model", model, "--model_args",
               f"model={MODEL},base_url={stack.base_url}/{endpoint}{model_args},"
               "num_concurrent=1,max_retries=1",
               "--tasks", ",".join(tasks), "--include_path", str(task_dir),
               "--output_path", str(output), "--log_samples", *extra]
    # OPENAI_API_KEY is where local-completions takes the key for its generation requests.
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "OPENAI_API_KEY": API_KEY, "HF_DATASETS_CACHE": str(output / "hf-datasets")}
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    (results_file,) = output.glob("*/results_*.json")
    results = json.loads(results_file.read_text())
    results["samples"] = {
        task: [json.loads(line) for line in next(output.glob(f"*/samples_{task}_*.jsonl"))
               .read_text().splitlines()]
        for task in tasks}
    return results


def by_doc(samples: list[dict]) -> list[dict]:
    return sorted(samples, key=lambda sample: sample["doc_id"])


@pytest.fixture(scope="module")
def completions_run(stack, task_dir, tmp_path_factory) -> dict:
    """One `local-completions` run over the three completion tasks (one CLI start, not three)."""
    return run_lm_eval(stack, task_dir, tmp_path_factory.mktemp("lm_eval_out"),
                       "pagedserve_generate", "pagedserve_choice", "pagedserve_perplexity")


def test_generate_until_over_completions_in_batches_matches_the_api(stack, completions_run):
    results = completions_run
    samples = by_doc(results["samples"]["pagedserve_generate"])
    assert results["n-samples"]["pagedserve_generate"]["effective"] == len(GENERATE)
    # What lm_eval sent: each question's token ids, greedy, its stop strings (the task's and
    # the end-of-text token from /tokenizer_info) and its seed.
    eos = stack.tokenizer_info()["eos_token"]
    with stack.openai() as client:
        expected = [client.completions.create(
            model=MODEL, prompt=stack.token_ids(doc["question"]), max_tokens=MAX_GEN_TOKS,
            temperature=0, stop=["\n", eos], seed=1234).choices[0].text for doc in GENERATE]
    assert [sample["resps"][0][0] for sample in samples] == expected
    exact = sum(text == doc["answer"] for text, doc in zip(expected, GENERATE)) / len(GENERATE)
    assert results["results"]["pagedserve_generate"]["exact_match,none"] == exact


def test_generate_until_over_chat_with_its_template_matches_the_api(stack, task_dir, tmp_path):
    results = run_lm_eval(stack, task_dir, tmp_path, "pagedserve_chat_generate", chat=True)
    samples = by_doc(results["samples"]["pagedserve_chat_generate"])
    with stack.openai() as client:
        expected = [client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": doc["question"]}],
            max_tokens=MAX_GEN_TOKS, temperature=0, stop=["\n"], seed=1234,
        ).choices[0].message.content for doc in GENERATE]
    assert [sample["resps"][0][0] for sample in samples] == expected
    exact = sum(text == doc["answer"] for text, doc in zip(expected, GENERATE)) / len(GENERATE)
    assert results["results"]["pagedserve_chat_generate"]["exact_match,none"] == exact


def test_multiple_choice_picks_the_choice_the_api_scores_highest(stack, completions_run):
    # Each choice's loglikelihood is the sum of its tokens' log-probabilities after the
    # question; lm_eval picks the largest.
    results = completions_run
    samples = by_doc(results["samples"]["pagedserve_choice"])
    correct = []
    for doc, sample in zip(MULTIPLE_CHOICE, samples):
        context = stack.token_ids(doc["question"])
        ours = []
        for choice in doc["choices"]:
            logprobs = stack.prompt_logprobs(context + stack.token_ids(choice))
            ours.append(sum(logprobs[len(context):]))
        # The samples file writes each (loglikelihood, is_greedy) pair as strings.
        theirs = [float(loglikelihood) for loglikelihood, _ in sample["filtered_resps"]]
        assert theirs == pytest.approx(ours, abs=1e-4)
        picked = max(range(len(ours)), key=ours.__getitem__)
        assert sample["acc"] == float(picked == doc["answer"])
        correct.append(picked == doc["answer"])
    assert results["results"]["pagedserve_choice"]["acc,none"] == pytest.approx(
        sum(correct) / len(correct))


def test_perplexity_is_the_api_s_prompt_logprobs_per_byte_and_word(stack, completions_run):
    # Each passage is scored whole after the BOS token: lm_eval's rolling window, one window
    # for a passage this short.
    results = completions_run
    bos = stack.token_ids(stack.tokenizer_info()["bos_token"])
    total_logprob = sum(sum(stack.prompt_logprobs(bos + stack.token_ids(doc["text"]))[1:])
                        for doc in PASSAGES)
    total_bytes = sum(len(doc["text"].encode()) for doc in PASSAGES)
    total_words = sum(len(re.split(r"\s+", doc["text"])) for doc in PASSAGES)
    perplexity = results["results"]["pagedserve_perplexity"]
    assert perplexity["bits_per_byte,none"] == pytest.approx(
        -total_logprob / total_bytes / math.log(2), rel=1e-4)
    assert perplexity["word_perplexity,none"] == pytest.approx(
        math.exp(-total_logprob / total_words), rel=1e-4)
