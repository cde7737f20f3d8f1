"""The tokenizer files an executor checks at start and serves through GetTokenizer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from executor_service.model.embedded import VOCAB_SIZE, write_embedded_checkpoint
from executor_service.model.model_config import UnsupportedModel
from executor_service.model.tokenizer_files import load_tokenizer_files


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedded_checkpoint(tmp_path_factory.mktemp("embedded"))


@pytest.fixture
def checkpoint(embedded: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(embedded, tmp_path / "model"))


def test_the_embedded_tokenizer_travels_with_its_chat_template(checkpoint):
    files = load_tokenizer_files(checkpoint, VOCAB_SIZE)
    assert list(files.files) == ["tokenizer.json", "tokenizer_config.json"]
    tokenizer = Tokenizer.from_str(files.files["tokenizer.json"].decode())
    assert tokenizer.encode("hé", add_special_tokens=False).ids == list("hé".encode())
    assert "chat_template" in json.loads(files.files["tokenizer_config.json"])


def test_the_digest_changes_with_any_file(checkpoint):
    before = load_tokenizer_files(checkpoint, VOCAB_SIZE).digest
    assert load_tokenizer_files(checkpoint, VOCAB_SIZE).digest == before
    (checkpoint / "chat_template.jinja").write_text("{{ messages }}")
    after = load_tokenizer_files(checkpoint, VOCAB_SIZE)
    assert after.digest != before and "chat_template.jinja" in after.files


def test_a_checkpoint_without_tokenizer_json_is_refused(checkpoint):
    (checkpoint / "tokenizer.json").unlink()
    with pytest.raises(UnsupportedModel, match="has no tokenizer.json"):
        load_tokenizer_files(checkpoint, VOCAB_SIZE)


def test_a_tokenizer_bigger_than_the_vocabulary_is_refused(checkpoint):
    with pytest.raises(UnsupportedModel, match=f"{VOCAB_SIZE} tokens but the model's "
                                               "vocab_size is 200"):
        load_tokenizer_files(checkpoint, 200)


@pytest.mark.parametrize("name, content, message", [
    ("tokenizer.json", "{not json", "does not load as a tokenizer"),
    ("tokenizer_config.json", "{not json", "is not valid JSON"),
])
def test_damaged_files_are_refused(checkpoint, name, content, message):
    (checkpoint / name).write_text(content)
    with pytest.raises(UnsupportedModel, match=message):
        load_tokenizer_files(checkpoint, VOCAB_SIZE)
