"""The embedded default model, served when `--model` is omitted: a small Llama with fixed random
weights and a byte-level tokenizer. Its text is gibberish, but every code path is real.

It is materialised as an ordinary Hugging Face checkpoint directory, so the executor loads it
with the same code as any downloaded checkpoint and `transformers` can load it as a reference.
Everything is derived from constants in this file, so every process on every machine writes the
same bytes (`config.json` aside, whose JSON layout is ours too): weights come from a private,
seeded `torch.Generator`, never the global RNG.

Token ids: 0..255 are the UTF-8 bytes themselves (id == byte value), then the special tokens.
Encoding adds no BOS automatically; a caller that wants one prepends `BOS_TOKEN` itself.

Its output is printable ASCII: the weights are built so that a byte outside `PRINTABLE_BYTES`
(a control byte such as ESC, DEL, or any byte of 0x80 and up, which could form a C1 control or
invalid UTF-8) always scores far below a printable one, greedy or sampled, whatever the prompt
(`ban_unprintable_bytes` says how; tests/executor/test_embedded_model.py checks the bound). Of the
special tokens only EOS and <|end|> are generated, never greedily.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

EMBEDDED_MODEL_NAME = "pagedserve-embedded-llama"
# Part of the cache directory name: bump it whenever anything below changes what is written.
EMBEDDED_MODEL_VERSION = 3   # 2: only printable ASCII bytes can be generated; 3: tool calls
WEIGHTS_SEED = 20240917

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
CHAT_ROLES = ("system", "user", "assistant")
END_OF_TURN_TOKEN = "<|end|>"
# Appended after the 256 byte ids in this order: BOS = 256, EOS = 257, <|system|> = 258,
# <|user|> = 259, <|assistant|> = 260, <|end|> = 261.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, *(f"<|{role}|>" for role in CHAT_ROLES),
                  END_OF_TURN_TOKEN)
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
BOS_TOKEN_ID = 256 + SPECIAL_TOKENS.index(BOS_TOKEN)
EOS_TOKEN_ID = 256 + SPECIAL_TOKENS.index(EOS_TOKEN)
# The bytes the model can generate: printable ASCII and the newline.
PRINTABLE_BYTES = frozenset([ord("\n"), *range(0x20, 0x7F)])
END_OF_TURN_TOKEN_ID = 256 + SPECIAL_TOKENS.index(END_OF_TURN_TOKEN)
# Never generated: the other bytes, BOS and the role tokens. Generated, but never the greedy
# choice and rarely sampled: the tokens that end a text (EOS, <|end|>).
BANNED_TOKEN_IDS = (*(byte for byte in range(256) if byte not in PRINTABLE_BYTES),
                    *(token for token in range(256, VOCAB_SIZE)
                      if token not in (EOS_TOKEN_ID, END_OF_TURN_TOKEN_ID)))
ENDING_TOKEN_IDS = (EOS_TOKEN_ID, END_OF_TURN_TOKEN_ID)
# The residual stream's last dimension is held at HELD_VALUE by construction; in it, each banned
# token's lm_head row has -BAN_WEIGHT and each ending token's -ENDING_WEIGHT (powers of two:
# exact in float16 and bfloat16).
HELD_DIM = 17   # any dimension works; with this one greedy texts loop less than with some
HELD_VALUE = 1.0
BAN_WEIGHT = 2.0 ** 15
ENDING_WEIGHT = 2.0

# Each message is `<|role|>content<|end|>`; a generation prompt opens the assistant's turn.
# Tools follow the Hermes / Qwen 2.5 convention, which gateway/tool_calls.py parses: with tools,
# a first system turn lists them as JSON lines inside <tools></tools> (after the request's own
# system message) and shows the call format; an assistant's calls are written as
# `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks; tool results come
# back in a user turn, one <tool_response></tool_response> block per consecutive tool message.
# Without tools or tool messages a conversation renders as it always did.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|system|>' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ 'You can call functions. Their signatures are listed one per line between <tools> and "
    "</tools>:\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nTo call a function, answer with its name and arguments as a JSON object "
    "between <tool_call> and </tool_call>, one block per call:\n<tool_call>\n"
    "{\"name\": <function name>, \"arguments\": <arguments object>}\n</tool_call><|end|>' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|user|>' }}"
    "{% else %}{{ '\n' }}{% endif %}"
    "{{ '<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|end|>' }}{% endif %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|assistant|>' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] %}"
    "{% set arguments = call['function']['arguments'] %}"
    "{% if message['content'] or not loop.first %}{{ '\n' }}{% endif %}"
    "{{ '<tool_call>\n{\"name\": ' + (call['function']['name'] | tojson) + ', \"arguments\": ' "
    "+ (arguments if arguments is string else arguments | tojson) + '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|end|>' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# Written last into a finished checkpoint: the sha256 of every other file, so a directory left
# half-written or damaged later is recognised and rebuilt.
MARKER_FILE = "pagedserve-embedded.json"
CACHE_DIR_ENV = "PAGEDSERVE_CACHE_DIR"


@dataclass(frozen=True, slots=True)
class LlamaRecipe:
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 2           # grouped-query attention: 4 query heads share each kv head
    head_dim: int = 32
    intermediate_size: int = 704
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    # Standard deviations of the random weights, picked by greedy-decoding 30 prompts for 48
    # tokens. With 0.02 everywhere (the usual init) the logits are nearly flat and 13 of 30
    # locked onto one or two tokens. A unit-scale embedding makes the output depend on the
    # input; 0.05 in the blocks makes it depend on context too (0/30 collapsed, ~22 distinct
    # tokens in the last 32) while staying tame enough that bfloat16 mostly decodes the same
    # tokens as float32; lm_head 0.5 puts the median top-2 logit gap near 2 (so greedy
    # outputs of two correct implementations do not flip on rounding noise) and still leaves
    # about 0.7 nats of entropy at temperature 1 for sampling to act on.
    embed_std: float = 1.0
    matrix_std: float = 0.05
    lm_head_std: float = 0.5


RECIPE = LlamaRecipe()


def write_embedded_checkpoint(directory: Path) -> Path:
    """Writes the whole checkpoint into `directory` (created if needed) and returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", hf_config(RECIPE))
    write_json(directory / "generation_config.json", {
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": EOS_TOKEN_ID,   # spares transformers' "setting pad to eos" warning
    })
    save_file(random_weights(RECIPE), str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    build_tokenizer().save(str(directory / "tokenizer.json"))
    write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        # Byte tokens must decode verbatim: no "tidying" of spaces before punctuation.
        "clean_up_tokenization_spaces": False,
        "model_max_length": RECIPE.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    })
    write_json(directory / MARKER_FILE, {
        "name": EMBEDDED_MODEL_NAME,
        "version": EMBEDDED_MODEL_VERSION,
        "sha256": {path.name: file_sha256(path) for path in sorted(directory.iterdir())
                   if path.name != MARKER_FILE},
    })
    return directory


def embedded_model_dir(cache_root: Path | None = None) -> Path:
    """The checkpoint directory of the embedded model, built on first use.

    The checkpoint is written into a temporary sibling and renamed into place, so concurrent
    executors never see it half-written; when two build it at once, the first rename wins and
    the other discards its copy. A directory whose files no longer match their marker is
    replaced by a fresh build.
    """
    root = Path(cache_root or os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache/pagedserve")
    target = root / "models" / f"{EMBEDDED_MODEL_NAME}-{EMBEDDED_MODEL_VERSION}"
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        write_embedded_checkpoint(build)
        # A few rounds at most: each round either installs our build or finds a complete one,
        # unless another process keeps removing a broken copy at the same moment.
        for _ in range(5):
            try:
                os.rename(build, target)
                return target
            except OSError:
                if is_complete(target):
                    return target
            discard_broken(target)
        raise RuntimeError(f"could not install the embedded model at {target}")
    finally:
        shutil.rmtree(build, ignore_errors=True)


def is_complete(directory: Path) -> bool:
    try:
        marker = json.loads((directory / MARKER_FILE).read_text())
        return marker["version"] == EMBEDDED_MODEL_VERSION and all(
            file_sha256(directory / name) == digest for name, digest in marker["sha256"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def discard_broken(target: Path) -> None:
    """Moves a broken checkpoint aside (atomically, so a racing process sees it either whole or
    gone) and deletes it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.trash-", dir=target.parent))
    try:
        os.rename(target, trash / "old")
    except FileNotFoundError:
        pass            # another process already moved it
    shutil.rmtree(trash, ignore_errors=True)


def hf_config(recipe: LlamaRecipe) -> dict:
    """config.json in both dialects: transformers 5 names first (`rope_parameters`, `dtype`),
    then the transformers 4 names (`rope_theta`, `torch_dtype`) that older readers look for.
    Both load in transformers 5; the values agree because they come from one recipe."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": recipe.hidden_size,
        "intermediate_size": recipe.intermediate_size,
        "num_hidden_layers": recipe.num_layers,
        "num_attention_heads": recipe.num_heads,
        "num_key_value_heads": recipe.num_kv_heads,
        "head_dim": recipe.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": recipe.rms_norm_eps,
        "max_position_embeddings": recipe.max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": recipe.rope_theta},
        "rope_theta": recipe.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "dtype": "float32",
        "torch_dtype": "float32",
        "pagedserve_recipe": {"name": EMBEDDED_MODEL_NAME, "version": EMBEDDED_MODEL_VERSION,
                              "seed": WEIGHTS_SEED, **asdict(recipe),
                              "generates_only_bytes": sorted(PRINTABLE_BYTES),
                              "ban_weight": BAN_WEIGHT, "ending_weight": ENDING_WEIGHT},
    }


def random_weights(recipe: LlamaRecipe) -> dict[str, torch.Tensor]:
    """Float32 weights under the Hugging Face Llama parameter names, drawn in a fixed order
    from one seeded generator.

    Uniform rather than normal draws: torch turns a generator's integers into uniforms with
    exact arithmetic, while its vectorised normal sampler goes through log/cos whose last bit
    may differ between CPU instruction sets, and the bytes must not.
    """
    generator = torch.Generator(device="cpu").manual_seed(WEIGHTS_SEED)

    def uniform(rows: int, cols: int, std: float) -> torch.Tensor:
        half_width = std * math.sqrt(3.0)     # U(-a, a) has standard deviation a / sqrt(3)
        draw = torch.rand(rows, cols, generator=generator, dtype=torch.float32)
        return (draw * 2.0 - 1.0) * half_width

    hidden, q_width = recipe.hidden_size, recipe.num_heads * recipe.head_dim
    kv_width = recipe.num_kv_heads * recipe.head_dim
    weights = {"model.embed_tokens.weight": uniform(VOCAB_SIZE, hidden, recipe.embed_std)}
    for layer in range(recipe.num_layers):
        prefix = f"model.layers.{layer}."
        shapes = {  # (out_features, in_features), as nn.Linear stores them
            "self_attn.q_proj": (q_width, hidden),
            "self_attn.k_proj": (kv_width, hidden),
            "self_attn.v_proj": (kv_width, hidden),
            "self_attn.o_proj": (hidden, q_width),
            "mlp.gate_proj": (recipe.intermediate_size, hidden),
            "mlp.up_proj": (recipe.intermediate_size, hidden),
            "mlp.down_proj": (hidden, recipe.intermediate_size),
        }
        for name, (rows, cols) in shapes.items():
            weights[f"{prefix}{name}.weight"] = uniform(rows, cols, recipe.matrix_std)
        weights[f"{prefix}input_layernorm.weight"] = torch.ones(hidden)
        weights[f"{prefix}post_attention_layernorm.weight"] = torch.ones(hidden)
    weights["model.norm.weight"] = torch.ones(hidden)
    weights["lm_head.weight"] = uniform(VOCAB_SIZE, hidden, recipe.lm_head_std)
    ban_unprintable_bytes(weights, recipe)
    return weights


def ban_unprintable_bytes(weights: dict[str, torch.Tensor], recipe: LlamaRecipe) -> None:
    """Makes every byte outside PRINTABLE_BYTES lose to a printable one by a wide margin.

    1. One residual dimension (HELD_DIM) is the same constant in every token's embedding, and
       no layer writes to it (its row of every o_proj and down_proj is zero), so it reaches the
       final RMSNorm unchanged, for any input. There it becomes h = HELD_VALUE / rms(x) > 0.
    2. Each banned token's lm_head row is a copy of a printable byte's row, except that it has
       -BAN_WEIGHT in HELD_DIM, where every other row has 0. Its logit is therefore exactly its
       printable twin's minus BAN_WEIGHT * h: it can never be the greedy choice, and sampling
       gives it exp(-BAN_WEIGHT * h / temperature) of its twin's chance. BOS and the role
       tokens are banned the same way; EOS and <|end|> get -ENDING_WEIGHT instead, so they
       are never the greedy choice but a sampled text still ends now and then.
    3. h has a floor: each layer's attention output is a mix of value vectors of a normalised
       input and its MLP output a fixed function of one, so the residual norm has a bound that
       no input can exceed (`held_dim_floor` computes it from the weights: about 1/270 here,
       while about 1 is typical), which puts the banned logits at least 120 below their twins
       (exp(-120) is 0 in float32) and typically tens of thousands below. BAN_WEIGHT is the
       largest power of two that float16 holds.
    """
    weights["model.embed_tokens.weight"][:, HELD_DIM] = HELD_VALUE
    for layer in range(recipe.num_layers):
        weights[f"model.layers.{layer}.self_attn.o_proj.weight"][HELD_DIM, :] = 0.0
        weights[f"model.layers.{layer}.mlp.down_proj.weight"][HELD_DIM, :] = 0.0
    lm_head = weights["lm_head.weight"]
    lm_head[:, HELD_DIM] = 0.0
    printable = sorted(PRINTABLE_BYTES - {ord("\n")})
    penalties = [*((token, BAN_WEIGHT) for token in BANNED_TOKEN_IDS),
                 *((token, ENDING_WEIGHT) for token in ENDING_TOKEN_IDS)]
    for index, (token, weight) in enumerate(penalties):
        lm_head[token] = lm_head[printable[index % len(printable)]]
        lm_head[token, HELD_DIM] = -weight


def held_dim_floor(weights: dict[str, torch.Tensor], recipe: LlamaRecipe) -> float:
    """A lower bound, valid for every input, on the held dimension after the final RMSNorm:
    HELD_VALUE / rms(x) with rms(x) bounded through the norm of the residual stream x.

    With n the normalised input of a layer (||n|| <= sqrt(hidden), the norm weights being 1):
    an attention head outputs a convex mix of its value vectors, each at most
    ||W_v(head)|| sqrt(hidden) long; the MLP's silu(g) * u has |silu(g_i)| <= |g_i| <= (norm of
    gate row i) sqrt(hidden), so it is at most max_i ||gate_i|| ||W_up|| hidden long. Spectral
    norms bound the matrices."""
    hidden = recipe.hidden_size
    root = math.sqrt(hidden)
    group = recipe.num_heads // recipe.num_kv_heads

    def spectral(matrix: torch.Tensor) -> float:
        return float(torch.linalg.matrix_norm(matrix.double(), ord=2))

    bound = float(weights["model.embed_tokens.weight"].double().norm(dim=1).max())
    for layer in range(recipe.num_layers):
        prefix = f"model.layers.{layer}."
        v_proj = weights[prefix + "self_attn.v_proj.weight"]
        heads = v_proj.double().reshape(recipe.num_kv_heads, recipe.head_dim, hidden)
        mixed = math.sqrt(group * sum(spectral(head) ** 2 for head in heads)) * root
        bound += spectral(weights[prefix + "self_attn.o_proj.weight"]) * mixed
        gate = weights[prefix + "mlp.gate_proj.weight"].double().norm(dim=1).max()
        inner = float(gate) * root * spectral(weights[prefix + "mlp.up_proj.weight"]) * root
        bound += spectral(weights[prefix + "mlp.down_proj.weight"]) * inner
    rms = math.sqrt(bound ** 2 / hidden + recipe.rms_norm_eps)
    return HELD_VALUE / rms


def byte_symbols() -> list[str]:
    """The printable character standing for each byte value, indexed by byte: the mapping
    `tokenizers`' ByteLevel pre-tokenizer applies. Printable Latin-1 bytes stand for
    themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen) take the characters from
    U+0100 upwards in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    symbols, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE without merges: every UTF-8 byte is one token whose id is the byte value,
    so any string round-trips exactly. No regex split: with no merges it could not change the
    ids, only cost time."""
    symbols = byte_symbols()
    if set(symbols) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("tokenizers' ByteLevel alphabet is not the one this code assumes")
    tokenizer = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token in SPECIAL_TOKENS])
    return tokenizer


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def file_sha256(path: Path) -> str:
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()
