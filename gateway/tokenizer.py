"""Text <-> token ids for one model, built from the tokenizer files its executor serves
(Executor.GetTokenizer: `tokenizer.json` plus, when present, `tokenizer_config.json`,
`special_tokens_map.json` and the chat template files).

Ids must equal what `transformers.AutoTokenizer.from_pretrained(checkpoint)` produces, so the
`tokenizers` pipeline from tokenizer.json is adjusted the way transformers 5's fast tokenizer
(`PreTrainedTokenizerFast`, alias `TokenizersBackend`) adjusts it on load:

- named special tokens from the config (bos_token, eos_token, ...) and extra special tokens that
  tokenizer.json lacks are added to it as special tokens;
- tokenizer.json's post-processor alone decides what `add_special_tokens=True` adds (Llama 3's
  BOS, say). `add_bos_token` / `add_eos_token` in tokenizer_config.json are ignored, because
  transformers 5 drops them whenever a tokenizer.json exists, which here it always does;
- truncation and padding saved in tokenizer.json are off, as `tokenizer(text)` has them.

transformers' model-specific classes that rebuild the pipeline in Python (e.g. LlamaTokenizer,
which builds its own Metaspace pre-tokenizer) are not imitated: a checkpoint whose config names
one may tokenize differently here. Decoding never applies `clean_up_tokenization_spaces`, which
transformers 5 defaults off and ignores for BPE anyway.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Tokenizer

from gateway.chat_template import ChatTemplate

# The standard named special tokens transformers hands to chat templates.
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")


class GatewayTokenizer:
    """Thin: a `tokenizers.Tokenizer` (`tokenizer`, which the incremental detokenizer reads)
    plus the model's special tokens and chat template."""

    def __init__(self, tokenizer: Tokenizer, special_tokens: dict[str, str],
                 chat_template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        # Template variable name -> token text, e.g. {"bos_token": "<s>", "eos_token": "</s>"}.
        self.special_tokens = special_tokens
        self.chat_template = chat_template
        # Every id encode can return is below this (base vocabulary plus added tokens).
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._token_id("bos_token")
        self.eos_token_id = self._token_id("eos_token")

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> GatewayTokenizer:
        tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
        config = json.loads(files.get("tokenizer_config.json", b"{}"))
        # transformers reads special_tokens_map.json only for configs older than
        # `added_tokens_decoder`; its entries then win over the config's.
        if "special_tokens_map.json" in files and "added_tokens_decoder" not in config:
            config = {**config, **json.loads(files["special_tokens_map.json"])}
        named, extra = special_tokens(config)
        present = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
        missing = [AddedToken(text, special=True, normalized=False)
                   for text in dict.fromkeys([*named.values(), *extra]) if text not in present]
        if missing:
            tokenizer.add_special_tokens(missing)
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return cls(tokenizer, named, ChatTemplate.from_files(files, named))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Raises ChatTemplateError (or its InvalidMessage) for a request that cannot render."""
        return self.chat_template.render(messages, add_generation_prompt, tools)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True,
                    add_special_tokens: bool = False,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        # The template writes BOS and the like itself; adding them again would double them,
        # so only a caller who asks (vLLM's /tokenize takes the flag) gets them added.
        return self.encode(self.render_chat(messages, add_generation_prompt, tools),
                           add_special_tokens=add_special_tokens)

    def _token_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self.tokenizer.token_to_id(text)


def special_tokens(config: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(named special tokens, extra special tokens) from a tokenizer_config.json.

    Named ones are the standard seven plus model-specific `*_token` keys (e.g. `image_token`)
    and the entries of an `extra_special_tokens` dict, as transformers 5 collects them; all are
    chat template variables. A token is written as its text or as a serialized AddedToken.
    """
    named = {}
    for key, value in config.items():
        if (key in NAMED_SPECIAL_TOKENS or key.endswith("_token")) and token_text(value):
            named[key] = token_text(value)
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if isinstance(extra, Mapping):
        named.update({key: token_text(value) for key, value in extra.items()
                      if token_text(value)})
        extra = []
    return named, [token_text(value) for value in extra if token_text(value)]


def token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None

