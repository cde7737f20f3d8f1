"""The peer benchmark's mid-size checkpoint: a Llama of about 64M parameters with a 32,000-token
vocabulary and fixed random weights, big enough that the matmuls, not the serving overhead,
dominate a step (the embedded default has 2M parameters and 262 tokens).

Written with transformers' `save_pretrained` (config.json, generation_config.json,
model.safetensors) plus a `tokenizers` word-level tokenizer.json that covers every id: id 0 is
`<unk>`, 1 `<s>` (BOS), 2 `</s>` (EOS), and id i ≥ 3 is the word `w<i>`, so every id the model
can generate decodes to text, and any text of such words encodes back to the same ids. Both
servers, and vLLM's benchmark client, tokenize with that one file.

The weights are uniform draws from one seeded generator, with the embedded model's scales (unit
embedding, 0.05 in the blocks) and an lm_head scale that puts the top-2 logit gap of a 32k
vocabulary near that of the embedded model, so greedy outputs do not flip on rounding noise.
Cached under `$PAGEDSERVE_CACHE_DIR/models/` (default ~/.cache/pagedserve/models/, where the
embedded model lives), built on first use into a temporary sibling and renamed into place; a
marker file written last names the recipe, so a half-written or older one is rebuilt.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from executor_service.model.embedded import CACHE_DIR_ENV

VERSION = 1
SEED = 20260101
MARKER_FILE = "pagedserve-bench-checkpoint.json"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


@dataclass(frozen=True, slots=True)
class MidRecipe:
    vocab_size: int = 32000
    hidden_size: int = 512
    num_layers: int = 8
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 2048
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    embed_std: float = 1.0
    matrix_std: float = 0.05
    # Logit std = sqrt(hidden) * lm_head_std ≈ 9 at hidden 512: the expected top-2 gap of
    # 32k Gaussian logits is about std / sqrt(2 ln 32000) ≈ 2.
    lm_head_std: float = 0.4

    @property
    def name(self) -> str:
        return f"bench-llama-{round(self.num_parameters() / 1e6)}m-32k"

    def num_parameters(self) -> int:
        hidden, q, kv = self.hidden_size, self.num_heads * self.head_dim, \
            self.num_kv_heads * self.head_dim
        per_layer = (hidden * q * 2 + hidden * kv * 2 + 3 * hidden * self.intermediate_size
                     + 2 * hidden)
        return 2 * self.vocab_size * hidden + self.num_layers * per_layer + hidden


RECIPE = MidRecipe()


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache/pagedserve") / "models"


def checkpoint_dir(recipe: MidRecipe = RECIPE, root: Path | None = None) -> Path:
    """The cached checkpoint of `recipe`, written on first use."""
    root = Path(root) if root is not None else cache_root()
    target = root / f"{recipe.name}-v{VERSION}"
    if is_complete(target, recipe):
        return target
    root.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=root))
    try:
        write_checkpoint(build, recipe)
        if target.exists():
            shutil.rmtree(target)
        try:
            os.rename(build, target)
        except OSError:
            if not is_complete(target, recipe):   # another process won the race
                raise
        return target
    finally:
        shutil.rmtree(build, ignore_errors=True)


def is_complete(directory: Path, recipe: MidRecipe) -> bool:
    try:
        marker = json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker == marker_for(recipe)


def marker_for(recipe: MidRecipe) -> dict:
    return {"version": VERSION, "seed": SEED, "recipe": asdict(recipe)}


def write_checkpoint(directory: Path, recipe: MidRecipe = RECIPE) -> Path:
    """Writes the whole checkpoint into `directory` and returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=recipe.vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim, max_position_embeddings=recipe.max_position_embeddings,
        rms_norm_eps=recipe.rms_norm_eps, rope_theta=recipe.rope_theta,
        hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    model = LlamaForCausalLM(config).to(torch.float32)
    generator = torch.Generator(device="cpu").manual_seed(SEED)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
                continue
            std = (recipe.embed_std if "embed_tokens" in name
                   else recipe.lm_head_std if name.startswith("lm_head")
                   else recipe.matrix_std)
            # Uniform draws: exact arithmetic from the generator's integers, the same bytes on
            # every CPU (embedded.py says why not normal draws).
            draw = torch.rand(parameter.shape, generator=generator, dtype=torch.float32)
            parameter.copy_((draw * 2.0 - 1.0) * std * math.sqrt(3.0))
    model.save_pretrained(directory)
    write_tokenizer(directory, recipe)
    (directory / MARKER_FILE).write_text(json.dumps(marker_for(recipe), indent=1) + "\n")
    return directory


def word(token_id: int) -> str:
    return SPECIAL_TOKENS[token_id] if token_id < len(SPECIAL_TOKENS) else f"w{token_id}"


def write_tokenizer(directory: Path, recipe: MidRecipe = RECIPE) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {word(i): i for i in range(recipe.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[UNK_ID]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token in SPECIAL_TOKENS])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKENS[UNK_ID],
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": recipe.max_position_embeddings,
    }, indent=1) + "\n")
