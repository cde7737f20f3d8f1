"""Which checkpoint the serving benchmark serves: the embedded default on the CPU, a checkpoint
named by --model, or with --gpu a random-weight model of Qwen2.5-0.5B's shape.

The --gpu stand-in is throughput_workload's, plus what the stack needs beyond the engine: a
tokenizer, since the executor refuses a checkpoint without `tokenizer.json` and the gateway
detokenizes every token. No real vocabulary can be downloaded on the benchmark machines, so it
is a word-level tokenizer whose token i is the word `t<i>`, as many as the model's vocabulary:
every id decodes to text, and the gateway does the same per-token work as for a real one.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.throughput.workload import write_gpu_stand_in
from executor_service.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir


@dataclass(frozen=True, slots=True)
class ServedModel:
    # The checkpoint directory the in-process engine loads.
    directory: Path
    name: str
    # What the executor is told (--model); None: its embedded default, the same checkpoint.
    executor_model: Path | None


def model_for(model: Path | None, gpu: bool, scratch: Path) -> ServedModel:
    if model is not None:
        return ServedModel(model, model.name, model)
    if gpu:
        print("writing a random-weight model of Qwen2.5-0.5B's shape ...", file=sys.stderr)
        directory = write_gpu_stand_in(scratch / "qwen2.5-0.5b-shape")
        write_word_tokenizer(directory)
        return ServedModel(directory, "Qwen2.5-0.5B's shape, random weights", directory)
    return ServedModel(embedded_model_dir(), f"{EMBEDDED_MODEL_NAME} (the embedded default)",
                       None)


def write_word_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab_size = json.loads((directory / "config.json").read_text())["vocab_size"]
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)},
                                           unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))
