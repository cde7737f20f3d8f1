"""A choice's tokens into text: a stop token ends the completion without its text, and each
token's text_offset is where the text before it ends, also when a character spans tokens."""
from __future__ import annotations

from dataclasses import dataclass, field

from gateway.chat_template import ChatTemplate
from gateway.choice_stream import ChoiceStream
from gateway.tokenizer import GatewayTokenizer
from pagedserve.protocol.finish_reason import finish_reason_to_proto
from tests.support.sample_tokenizers import bytelevel_bpe


@dataclass
class Entry:
    """An executor TokenLogprob message's fields, as the choice stream reads them."""
    token_id: int
    logprob: float = -1.0
    top: list = field(default_factory=list)

    def HasField(self, name: str) -> bool:  # noqa: N802 - the protobuf method's name
        return False


def stream_of(tokenizer) -> ChoiceStream:
    return ChoiceStream(0, GatewayTokenizer(tokenizer, {}, ChatTemplate("", {}, is_default=True)), [], (),
                        True)


def test_a_stop_token_is_not_part_of_the_text():
    tokenizer = bytelevel_bpe()
    ids = tokenizer.encode("hello world").ids
    stop = ids[-1]
    delta = stream_of(tokenizer).advance(ids, [Entry(i) for i in ids],
                                         finish_reason_to_proto("stop"))
    assert delta.text == tokenizer.decode(ids[:-1])
    assert delta.token_ids == ids and len(delta.logprobs) == len(ids)
    # Its offset is the end of the text, where it would have started.
    assert delta.text_offsets[-1] == len(delta.text)
    assert stop in delta.token_ids
    # Ended by length, the last token's text stays.
    whole = stream_of(tokenizer).advance(ids, [], finish_reason_to_proto("length"))
    assert whole.text == "hello world"


def test_offsets_count_a_character_split_over_tokens_once():
    tokenizer = bytelevel_bpe()
    text = "a龍b"   # 龍 is outside the training corpus: it arrives as several byte tokens
    ids = tokenizer.encode(text).ids
    assert len(ids) > 3
    choice = stream_of(tokenizer)
    offsets, texts = [], ""
    for token_id in ids:   # one token per update, as decoding streams them
        delta = choice.advance([token_id], [Entry(token_id)], 0)
        offsets += delta.text_offsets
        texts += delta.text
    texts += choice.advance([], [], finish_reason_to_proto("length")).text
    assert texts == text
    # "a" at 0, every byte of 龍 where 龍 starts (1), "b" after it (2).
    assert offsets == [0] + [1] * (len(ids) - 2) + [2]
    # The same tokens in one update give the same offsets.
    together = stream_of(tokenizer).advance(ids, [Entry(i) for i in ids],
                                            finish_reason_to_proto("length"))
    assert together.text_offsets == offsets and together.text == text
