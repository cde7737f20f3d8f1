"""The gateway's tokenizer and chat templates, with transformers 5 as the reference: every id and
every rendered prompt must equal what AutoTokenizer gives for the same checkpoint files."""
from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from executor_service.model.embedded import (BOS_TOKEN_ID, EOS_TOKEN_ID, VOCAB_SIZE,
                                             write_embedded_checkpoint)
from executor_service.model.tokenizer_files import load_tokenizer_files
from gateway.chat_template import (DEFAULT_CHAT_TEMPLATE, ChatTemplate, ChatTemplateError,
                                   InvalidMessage, compile_template)
from gateway.tokenizer import GatewayTokenizer
from pagedserve.common.errors import InvalidArgument

TEXTS = ["Hello, world!", "  leading and trailing spaces  ", "你好，世界", "emoji 🙂👩‍👩‍👧 mix",
         "<|begin_of_text|>special token typed by a user", ""]
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Where is 北京? 🙂 "},
        {"role": "assistant", "content": "In China."},
        {"role": "user", "content": "Thanks"}]

BEGIN, END, HEADER, END_HEADER, EOT = ("<|begin_of_text|>", "<|end_of_text|>",
                                       "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# Llama 3's shape, with the features Hub templates lean on: bos_token, loop.first / loop.last,
# raise_exception, tojson, whitespace control by trim_blocks / lstrip_blocks.
LLAMA3_TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'system' and not loop.first %}
        {{ raise_exception('System message must come first') }}
    {% endif %}
    {% if message['role'] == 'tool' %}
        {% set content = {'output': message['content']} | tojson %}
    {% else %}
        {% set content = message['content'] | trim %}
    {% endif %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ content }}<|eot_id|>
    {% if loop.last and add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

    {% endif %}
{% endfor %}
"""


def files_of(directory: Path) -> dict[str, bytes]:
    return load_tokenizer_files(directory, vocab_size=1 << 20).files


def both(directory: Path) -> tuple[GatewayTokenizer, PreTrainedTokenizerFast]:
    return GatewayTokenizer.from_files(files_of(directory)), AutoTokenizer.from_pretrained(directory)


def edit_config(directory: Path, **changes: object) -> None:
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedded_checkpoint(tmp_path_factory.mktemp("embedded"))


@pytest.fixture(scope="module")
def llama3_saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here, whose tokenizer.json post-processor adds BOS (as Llama 3's
    does), saved by transformers with LLAMA3_TEMPLATE."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[BEGIN, END, HEADER, END_HEADER, EOT])
    tokenizer.train_from_iterator(
        ["hello world, the quick brown fox jumps over the lazy dog"] * 20 + TEXTS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BEGIN} $A", pair=f"{BEGIN} $A $B:1", special_tokens=[(BEGIN, 0)])
    directory = tmp_path_factory.mktemp("llama3")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BEGIN, eos_token=EOT,
                            chat_template=LLAMA3_TEMPLATE).save_pretrained(directory)
    return directory


@pytest.fixture
def llama3(llama3_saved: Path, tmp_path: Path) -> Path:
    """A private copy a test may edit."""
    return Path(shutil.copytree(llama3_saved, tmp_path / "llama3"))


# -- encoding --------------------------------------------------------------------------------

@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_embedded_model_encodes_like_transformers(embedded, text, add_special_tokens):
    ours, reference = both(embedded)
    expected = reference(text, add_special_tokens=add_special_tokens)["input_ids"]
    assert ours.encode(text, add_special_tokens=add_special_tokens) == expected


def test_embedded_model_ids_are_utf8_bytes_and_special_tokens_match_whole(embedded):
    ours = GatewayTokenizer.from_files(files_of(embedded))
    assert ours.encode("hé") == [104, 0xC3, 0xA9]
    assert ours.encode("<|begin_of_text|>a") == [BOS_TOKEN_ID, 97]
    assert (ours.vocab_size, ours.bos_token_id, ours.eos_token_id) == (VOCAB_SIZE, BOS_TOKEN_ID,
                                                                       EOS_TOKEN_ID)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(embedded, skip_special_tokens):
    ours, reference = both(embedded)
    ids = [BOS_TOKEN_ID, *"héllo 🙂".encode(), EOS_TOKEN_ID]
    assert ours.decode(ids, skip_special_tokens) == reference.decode(
        ids, skip_special_tokens=skip_special_tokens)
    assert ours.decode(ids) == "héllo 🙂"


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("config_flags", [
    {}, {"add_bos_token": False}, {"add_eos_token": True}, {"add_bos_token": True}])
@pytest.mark.parametrize("post_processor", ["bos", None])
def test_only_tokenizer_json_post_processor_adds_special_tokens(llama3, post_processor,
                                                                 config_flags, add_special_tokens):
    """transformers 5 drops add_bos_token / add_eos_token when tokenizer.json exists."""
    edit_config(llama3, **config_flags)
    if post_processor is None:
        saved = json.loads((llama3 / "tokenizer.json").read_text())
        saved["post_processor"] = None
        (llama3 / "tokenizer.json").write_text(json.dumps(saved))
    ours, reference = both(llama3)
    for text in TEXTS:
        expected = reference(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert ours.encode(text, add_special_tokens) == expected
    plain = ours.encode("hello world", add_special_tokens=False)
    with_bos = post_processor == "bos" and add_special_tokens
    assert ours.encode("hello world", add_special_tokens) == [0] * with_bos + plain


def test_special_token_missing_from_tokenizer_json_is_added_like_transformers(llama3):
    edit_config(llama3, pad_token="<pad>")
    ours, reference = both(llama3)
    pad_id = ours.vocab_size - 1    # appended after everything tokenizer.json has
    assert ours.vocab_size == len(reference) and reference.pad_token_id == pad_id
    ids = ours.encode("<pad>hello")
    assert ids == reference("<pad>hello")["input_ids"] and ids[:2] == [0, pad_id]
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True) == "hello"
    assert ours.chat_template.special_tokens == {"bos_token": BEGIN, "eos_token": EOT,
                                                 "pad_token": "<pad>"}


# -- chat ------------------------------------------------------------------------------------

@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_embedded_model_chat_matches_transformers(embedded, add_generation_prompt):
    ours, reference = both(embedded)
    rendered = ours.render_chat(CHAT, add_generation_prompt)
    assert rendered == reference.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.encode_chat(CHAT, add_generation_prompt) == reference.apply_chat_template(
        CHAT, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt)
    assert rendered.startswith("<|system|>Be brief.<|end|><|user|>  Where is 北京? 🙂 <|end|>")
    assert rendered.endswith("<|assistant|>") == add_generation_prompt


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", [
    CHAT,
    CHAT[1:],
    [*CHAT, {"role": "assistant", "content": "Checking."},
     {"role": "tool", "content": "温度: 20°C <b>&</b>"}],
])
def test_llama3_like_template_matches_transformers(llama3_saved, messages,
                                                   add_generation_prompt):
    ours, reference = both(llama3_saved)
    rendered = ours.render_chat(messages, add_generation_prompt)
    assert rendered == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    ids = ours.encode_chat(messages, add_generation_prompt)
    assert ids == reference.apply_chat_template(
        messages, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt)
    # The template writes BOS; encode_chat must not add the post-processor's second one.
    assert ids.count(0) == 1 and ids[0] == 0
    assert rendered.endswith(f"{HEADER}assistant{END_HEADER}\n\n") == add_generation_prompt


def test_tojson_keeps_non_ascii_and_html_characters(llama3_saved):
    ours = GatewayTokenizer.from_files(files_of(llama3_saved))
    rendered = ours.render_chat([{"role": "tool", "content": "温度: 20°C <b>&</b>"}], False)
    # trim_blocks eats the newline after a block tag, not after `{{ bos_token }}`.
    assert rendered == (f'{BEGIN}\n{HEADER}tool{END_HEADER}\n\n'
                        f'{{"output": "温度: 20°C <b>&</b>"}}{EOT}\n')


def test_raise_exception_reaches_the_caller_with_the_templates_message(llama3_saved):
    ours, reference = both(llama3_saved)
    messages = [CHAT[1], CHAT[0]]
    with pytest.raises(jinja2.TemplateError, match="System message must come first"):
        reference.apply_chat_template(messages, tokenize=False)
    with pytest.raises(ChatTemplateError) as caught:
        ours.render_chat(messages)
    assert str(caught.value) == "System message must come first"
    assert isinstance(caught.value, InvalidArgument)    # answered INVALID_ARGUMENT


def test_chat_template_jinja_overrides_tokenizer_config(llama3):
    (llama3 / "chat_template.jinja").write_text("JINJA {{ messages[0]['content'] }}")
    edit_config(llama3, chat_template="CONFIG {{ messages[0]['content'] }}")
    ours, reference = both(llama3)
    assert ours.render_chat(CHAT) == reference.apply_chat_template(CHAT, tokenize=False) \
        == "JINJA Be brief."
    (llama3 / "chat_template.jinja").unlink()
    ours, reference = both(llama3)
    assert ours.render_chat(CHAT) == reference.apply_chat_template(CHAT, tokenize=False) \
        == "CONFIG Be brief."


def template_files(**files: object) -> dict[str, bytes]:
    """Companion files only (`tokenizer_config__json=...` names tokenizer_config.json): the
    template source needs no tokenizer.json."""
    encoded = {}
    for name, content in files.items():
        name = name.replace("__", ".")
        encoded[name] = (content if isinstance(content, str) else json.dumps(content)).encode()
    return encoded


@pytest.mark.parametrize("files, expected", [
    (template_files(tokenizer_config__json={"chat_template": [
        {"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]}),
     "DEFAULT"),
    (template_files(chat_template__json={"chat_template": "LEGACY"}), "LEGACY"),
    (template_files(tokenizer_config__json={"chat_template": "CONFIG"},
                    chat_template__json={"chat_template": "LEGACY"}), "CONFIG"),
    (template_files(tokenizer_config__json={"chat_template": "CONFIG"},
                    chat_template__jinja="JINJA"), "JINJA"),
])
def test_template_source_precedence(files, expected):
    template = ChatTemplate.from_files(files, {})
    assert (template.render(CHAT), template.is_default) == (expected, False)


@pytest.mark.parametrize("add_generation_prompt, expected", [
    (True, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\n"),
    (False, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"),
])
def test_model_without_template_gets_chatml_default(embedded, tmp_path, add_generation_prompt,
                                                    expected):
    directory = Path(shutil.copytree(embedded, tmp_path / "model"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    ours, reference = both(directory)
    messages = [CHAT[0], {"role": "user", "content": "Hi"}]
    assert ours.chat_template.is_default
    assert ours.render_chat(messages, add_generation_prompt) == expected
    assert expected == reference.apply_chat_template(
        messages, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False,
        add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("source, message", [
    ("{% for message in messages %}{{ message['role'] }}",
     "chat template does not compile: Unexpected end of template. Jinja was looking for the "
     "following tags: 'endfor' or 'else'. The innermost block that needs to be closed is 'for'."
     " (line 1)"),
    ("{{ nothing.attribute }}", "chat template failed: 'nothing' is undefined"),
    ("{{ 1 + messages[0]['content'] }}",
     "chat template failed: TypeError: unsupported operand type(s) for +: 'int' and 'str'"),
    ("{% set _ = messages.append(1) %}",
     "chat template failed: access to attribute 'append' of 'list' object is unsafe."),
    ("{% set ns = namespace(__class__=1) %}",
     "chat template failed: chat templates cannot store underscore-prefixed attributes, "
     "got '__class__'"),
])
def test_broken_templates_raise_chat_template_error(source, message):
    with pytest.raises(ChatTemplateError) as caught:
        ChatTemplate(source, {}, is_default=False).render(CHAT)
    assert str(caught.value) == message


def test_undefined_variables_render_empty_as_in_transformers():
    template = ChatTemplate("[{{ nothing }}]{% if tools %}T{% endif %}{{ strftime_now('%Y') }}",
                            {}, is_default=False)
    assert template.render(CHAT) == f"[]{datetime.now().year}"


def test_templates_compile_once():
    assert compile_template(LLAMA3_TEMPLATE) is compile_template(LLAMA3_TEMPLATE)


@pytest.mark.parametrize("messages, message", [
    ([], "messages must not be empty"),
    ({"role": "user", "content": "hi"}, "messages must be a list, got dict"),
    (["hi"], "messages[0] must be an object, got str"),
    ([{"content": "hi"}], "messages[0] has no role"),
    ([CHAT[0], {"role": "user"}], "messages[1] has no content"),
    ([CHAT[0], {"role": "user", "content": 5}], "messages[1].content must be a string, got int"),
    ([CHAT[0], {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
     "messages[1].content must be a string, got list"),
    ([{"role": "wizard", "content": "hi"}],
     "messages[0].role must be one of system, user, assistant, tool; got 'wizard'"),
    ([{"role": "user", "content": "hi", "name": 3}], "messages[0].name must be a string, got int"),
])
def test_invalid_messages_name_the_index_and_field(embedded, messages, message):
    ours = GatewayTokenizer.from_files(files_of(embedded))
    with pytest.raises(InvalidMessage) as caught:
        ours.encode_chat(messages)
    assert str(caught.value) == message


def test_none_valued_fields_are_dropped_like_transformers():
    template = ChatTemplate("{{ messages[0] | tojson }}", {}, is_default=False)
    assert template.render([{"role": "user", "content": "hi", "name": None}], False) == \
        '{"role": "user", "content": "hi"}'
