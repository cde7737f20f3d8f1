"""The streaming detokenizer: its deltas add up to the full decode exactly, for every id
sequence, on the three kinds of tokenizer a model brings (all built here, nothing downloaded).

- embedded: the embedded model's byte-level tokenizer, one id per byte;
- bytelevel: a GPT-2-style byte-level BPE trained on Chinese and emoji, so characters span
  tokens and tokens span characters;
- llama / metaspace: sentencepiece-style BPE with `<0xE4>` byte-fallback tokens and the "▁"
  leading-space convention, decoded as Llama 2 does (Replace, ByteFallback, Fuse, Strip) or
  with the Metaspace decoder.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders

from executor_service.model.embedded import EOS_TOKEN_ID, write_embedded_checkpoint
from gateway.detokenizer import IncrementalDetokenizer
from tests.support.sample_tokenizers import SAMPLES, bytelevel_bpe, sentencepiece_bpe

FFFD = "\ufffd"
@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    checkpoint = write_embedded_checkpoint(tmp_path_factory.mktemp("embedded"))
    return {
        "embedded": Tokenizer.from_file(str(checkpoint / "tokenizer.json")),
        "bytelevel": bytelevel_bpe(),
        "llama": sentencepiece_bpe(decoders.Sequence([
            decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(" ", 1, 0)])),
        "metaspace": sentencepiece_bpe(decoders.Sequence([
            decoders.ByteFallback(),
            decoders.Metaspace(replacement="▁", prepend_scheme="first")])),
    }


KINDS = ["embedded", "bytelevel", "llama", "metaspace"]


def stream(detokenizer: IncrementalDetokenizer, ids: list[int], sizes=(1,)) -> list[str]:
    """Every delta, `finish()`'s last, feeding ids in chunks of the given sizes in turn."""
    deltas, position, turn = [], 0, 0
    while position < len(ids):
        size = sizes[turn % len(sizes)]
        deltas.append(detokenizer.add(ids[position:position + size]))
        position, turn = position + size, turn + 1
    return deltas + [detokenizer.finish()]


def byte_ids(tokenizer: Tokenizer, data: bytes) -> list[int]:
    """Ids of one-byte tokens: the embedded model's own ids, or byte-fallback tokens."""
    if tokenizer.token_to_id("<0x00>") is None:
        return list(data)
    return [tokenizer.token_to_id(f"<0x{b:02X}>") for b in data]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sizes", [(1,), (3,), (2, 5, 1)])
def test_streamed_chinese_and_emoji_equal_the_full_decode(tokenizers, kind, sizes):
    tokenizer = tokenizers[kind]
    text = "中文很好，龍が飛ぶ。👩‍👩‍👧‍👦 and 🇯🇵!"
    ids = tokenizer.encode(text).ids
    deltas = stream(IncrementalDetokenizer(tokenizer), ids, sizes)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any(FFFD in delta for delta in deltas)


def test_a_character_is_sent_when_its_last_byte_arrives(tokenizers):
    deltas = stream(IncrementalDetokenizer(tokenizers["embedded"]), list("a中😀".encode()))
    assert deltas == ["a", "", "", "中", "", "", "", "😀", ""]


def test_a_chunk_sends_everything_before_an_incomplete_character(tokenizers):
    detokenizer = IncrementalDetokenizer(tokenizers["embedded"])
    assert detokenizer.add(list("ab中".encode())[:4]) == "ab"
    assert detokenizer.add([0xAD]) == "中"


def test_bytelevel_bpe_has_tokens_that_split_characters(tokenizers):
    # What makes the "bytelevel" cases worth running: ids whose own decode is incomplete.
    tokenizer = tokenizers["bytelevel"]
    ids = tokenizer.encode("我们喜欢中文").ids
    assert any(FFFD in tokenizer.decode([i]) for i in ids)


def test_invalid_bytes_are_sent_as_soon_as_a_later_byte_proves_them_invalid(tokenizers):
    detokenizer = IncrementalDetokenizer(tokenizers["embedded"])
    assert detokenizer.add([0xE4]) == ""         # could still become a character
    assert detokenizer.add([0x41]) == FFFD + "A"
    assert detokenizer.add([0xFF, 0xE4]) == FFFD  # FF is invalid; E4 may still complete
    assert detokenizer.finish() == FFFD


@pytest.mark.parametrize("kind", ["llama", "metaspace"])
def test_a_byte_run_is_held_until_it_ends_because_one_bad_byte_spoils_all_of_it(
        tokenizers, kind):
    tokenizer = tokenizers[kind]
    world = tokenizer.token_to_id("▁world")
    ids = [*byte_ids(tokenizer, b"A\xe4"), world]
    assert tokenizer.decode(ids) == FFFD * 2 + " world"
    assert stream(IncrementalDetokenizer(tokenizer), ids) == ["", "", FFFD * 2 + " world", ""]


@pytest.mark.parametrize("kind", ["llama", "metaspace"])
def test_an_invalid_byte_run_is_sent_a_replacement_char_per_token(tokenizers, kind):
    tokenizer = tokenizers[kind]
    ids = [*byte_ids(tokenizer, b"\xffA"), tokenizer.token_to_id("▁world")]
    assert tokenizer.decode(ids) == FFFD * 2 + " world"
    assert stream(IncrementalDetokenizer(tokenizer), ids) == [FFFD, FFFD, " world", ""]


@pytest.mark.parametrize("kind", ["llama", "metaspace"])
def test_an_invalid_byte_run_stays_invalid_however_long_it_grows(tokenizers, kind):
    # "AB" would be valid alone: the bytes must be decoded with the FF that spoiled the run.
    tokenizer = tokenizers[kind]
    ids = [*byte_ids(tokenizer, b"\xffAB"), tokenizer.token_to_id("▁world")]
    assert stream(IncrementalDetokenizer(tokenizer), ids) == [FFFD, FFFD, FFFD, " world", ""]


@pytest.mark.parametrize("skip, expected", [
    (True, ["", "", "", "中", ""]),
    (False, ["", FFFD + "<|end_of_text|>", "", FFFD, FFFD]),
])
def test_a_special_token_inside_a_character(tokenizers, skip, expected):
    tokenizer = tokenizers["embedded"]
    ids = [0xE4, EOS_TOKEN_ID, 0xB8, 0xAD]
    deltas = stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=skip), ids)
    assert deltas == expected
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_between_words(tokenizers, kind, skip):
    tokenizer = tokenizers[kind]
    special = EOS_TOKEN_ID if kind == "embedded" else tokenizer.token_to_id("</s>")
    ids = [*tokenizer.encode("hello 中文").ids, special, *tokenizer.encode(" world").ids]
    deltas = stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=skip), ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("kind", ["llama", "metaspace"])
def test_the_prompt_gives_the_first_token_its_leading_space(tokenizers, kind):
    tokenizer = tokenizers[kind]
    world = [tokenizer.token_to_id("▁world")]
    assert stream(IncrementalDetokenizer(tokenizer), world) == ["world", ""]
    prompt = tokenizer.encode("hello").ids
    assert stream(IncrementalDetokenizer(tokenizer, prompt_ids=prompt), world) == [" world", ""]


def test_a_prompt_ending_inside_a_character_is_not_context(tokenizers):
    # The prompt's E4 is cut from the context, so B8 AD decode alone, as they do in
    # decode(generated): the generated text never reaches back into the prompt's.
    detokenizer = IncrementalDetokenizer(tokenizers["embedded"], prompt_ids=[0x41, 0xE4])
    assert stream(detokenizer, [0xB8, 0xAD]) == ["", FFFD, FFFD]


@pytest.mark.parametrize("kind", ["llama", "metaspace"])
def test_a_prompt_ending_in_a_byte_run_keeps_the_text_before_it_as_context(tokenizers, kind):
    tokenizer = tokenizers[kind]
    prompt = [*tokenizer.encode("hello").ids, *byte_ids(tokenizer, "龍".encode())]
    world = [tokenizer.token_to_id("▁world")]
    assert stream(IncrementalDetokenizer(tokenizer, prompt_ids=prompt), world) == [" world", ""]


class CountingTokenizer:
    """Passes through to a tokenizer, recording how many ids each decode got."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.decoded = tokenizer, []

    def decode(self, ids, skip_special_tokens):
        self.decoded.append(len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_each_add_decodes_a_short_window_not_the_whole_text(tokenizers):
    tokenizer = tokenizers["llama"]
    counting = CountingTokenizer(tokenizer)
    prompt = tokenizer.encode("a prompt of ten tokens or so").ids
    ids = tokenizer.encode("hello world 中文 " * 100).ids
    detokenizer = IncrementalDetokenizer(counting, prompt_ids=prompt)
    counting.decoded.clear()    # choosing the context decodes the prompt's tail, once
    assert "".join(stream(detokenizer, ids)) == " " + tokenizer.decode(ids)
    # The first window holds the 5 context ids and the first new id; after that, the id of
    # the previous call and the new one (each slide decodes the new one alone too).
    assert max(counting.decoded) == 6
    assert max(counting.decoded[6:]) == 2


def test_add_after_finish_is_an_error(tokenizers):
    detokenizer = IncrementalDetokenizer(tokenizers["embedded"])
    assert detokenizer.add([]) == ""
    assert detokenizer.finish() == ""
    with pytest.raises(RuntimeError, match="after finish"):
        detokenizer.add([0x41])


@st.composite
def generations(draw, tokenizer: Tokenizer) -> list[int]:
    """Random ids (special tokens, ids that split characters), runs of random bytes and the
    ids of real text, so valid characters are spread over tokens too."""
    vocab = tokenizer.get_vocab_size()
    pieces = [tokenizer.encode(text).ids for text in SAMPLES]
    part = st.one_of(st.integers(0, vocab - 1).map(lambda i: [i]), st.sampled_from(pieces))
    if tokenizer.token_to_id("<0x00>") is not None:
        part |= st.binary(min_size=1, max_size=6).map(lambda data: byte_ids(tokenizer, data))
    parts = draw(st.lists(part, max_size=12))
    return [i for part in parts for i in part]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_ids_in_any_chunks_stream_to_exactly_the_full_decode(tokenizers, kind, data):
    tokenizer = tokenizers[kind]
    ids = data.draw(generations(tokenizer))
    skip = data.draw(st.booleans())
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    deltas = stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=skip), ids, sizes)
    full = tokenizer.decode(ids, skip_special_tokens=skip)
    position = 0
    for delta in deltas:    # each delta is final: never a U+FFFD that becomes a character
        assert delta == full[position:position + len(delta)]
        position += len(delta)
    assert position == len(full)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_after_a_prompt_the_deltas_are_what_the_generated_ids_add(tokenizers, kind, data):
    tokenizer = tokenizers[kind]
    prompt = tokenizer.encode(data.draw(st.sampled_from(["hello", "中文很好，", "A <s>"]))).ids
    ids = data.draw(generations(tokenizer))
    skip = data.draw(st.booleans())
    before = tokenizer.decode(prompt, skip_special_tokens=skip)
    after = tokenizer.decode(prompt + ids, skip_special_tokens=skip)
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip,
                                         prompt_ids=prompt)
    assert after.startswith(before)
    assert "".join(stream(detokenizer, ids, (2,))) == after[len(before):]
