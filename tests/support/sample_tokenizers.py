"""Tokenizers built here (nothing can be downloaded) of the kinds real checkpoints bring:

- bytelevel_bpe: GPT-2-style byte-level BPE trained on Chinese and emoji, so characters span
  tokens and tokens span characters;
- sentencepiece_bpe: BPE with `<0xE4>` byte-fallback tokens and the "▁" leading-space
  convention, decoded with the decoder given (Llama 2's, or Metaspace).
"""
from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "我们喜欢中文。中文很好，我们也喜欢你。",
    "你好世界，今天天气很好。",
    "emoji 😀😃😄 and family 👩‍👩‍👧 and flags 🇯🇵🇫🇷",
    "hello hello world world 中文 😀",
] * 20
# Text outside the corpus too: rare characters reach the tokenizers only as bytes.
SAMPLES = ["中文很好", "龍が飛ぶ", "👩‍👩‍👧‍👦 family", "🇯🇵 flag", " hello world", "café ñ"]
SPECIALS = ["<s>", "</s>"]


def bytelevel_bpe() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def sentencepiece_bpe(decoder: decoders.Decoder) -> Tokenizer:
    """Trained without byte tokens, then rebuilt with `<0x00>`..`<0xFF>` after the specials, as
    in Llama 2's vocabulary."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=250, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    vocab = {token: i for i, token in enumerate(
        ["<unk>", *SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *model["vocab"]])}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.add_special_tokens(["<unk>", *SPECIALS])
    tokenizer.pre_tokenizer = trained.pre_tokenizer
    tokenizer.decoder = decoder
    return tokenizer
