"""The checkpoint's tokenizer files, which the executor checks at start and hands to its clients.

The executor itself works on token ids; the gateway turns text into ids and back. Serving the
files from the executor (Executor.GetTokenizer) rather than making the gateway read the
checkpoint keeps one source of truth: the gateway needs no copy of the model directory, and the
digest in ExecutorInfo tells it when two executors would tokenize differently.

`tokenizer.json` (the `tokenizers` library's format, which every Llama, Mistral and Qwen
checkpoint on the Hub carries) is required, and must load and fit the model's vocabulary. The
files beside it that carry the chat template and special tokens travel with it when present.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from executor_service.model.model_config import UnsupportedModel

TOKENIZER_JSON = "tokenizer.json"
# Sent along when present: the chat template lives in tokenizer_config.json, or since
# transformers 4.43 / 5 in chat_template.jinja (or the older chat_template.json).
COMPANION_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json")
JSON_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.json")


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    # File name -> its bytes, tokenizer.json first.
    files: dict[str, bytes]
    # sha256 over every file's name and bytes: equal digests tokenize equally.
    digest: str


def load_tokenizer_files(directory: Path, vocab_size: int) -> TokenizerFiles:
    directory = Path(directory)
    path = directory / TOKENIZER_JSON
    if not path.is_file():
        raise UnsupportedModel(
            f"{directory} has no {TOKENIZER_JSON}: pagedserve needs a fast tokenizer's file "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(DIR) writes one)")
    files = {TOKENIZER_JSON: path.read_bytes()}
    try:
        tokenizer = Tokenizer.from_str(files[TOKENIZER_JSON].decode("utf-8"))
    except Exception as error:  # noqa: BLE001 - the library raises bare Exceptions
        raise UnsupportedModel(f"{path} does not load as a tokenizer: {error}") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise UnsupportedModel(
            f"{path} has {size} tokens but the model's vocab_size is {vocab_size}: some token "
            "ids would fall outside the embedding (tokenizer and weights do not match)")
    for name in COMPANION_FILES:
        if (directory / name).is_file():
            files[name] = (directory / name).read_bytes()
            if name in JSON_FILES:
                try:
                    json.loads(files[name])
                except ValueError as error:
                    raise UnsupportedModel(f"{directory / name} is not valid JSON: {error}") \
                        from None
    digest = hashlib.sha256()
    for name, data in files.items():
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return TokenizerFiles(files, digest.hexdigest())
