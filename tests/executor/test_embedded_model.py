"""The embedded default model: a deterministic Llama checkpoint that transformers loads as is,
with a byte-level tokenizer, cached atomically under one directory per recipe version."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from executor_service.model.embedded import (BAN_WEIGHT, BANNED_TOKEN_IDS, BOS_TOKEN_ID,
                                             CHAT_TEMPLATE, EMBEDDED_MODEL_NAME,
                                             EMBEDDED_MODEL_VERSION, ENDING_TOKEN_IDS,
                                             ENDING_WEIGHT, EOS_TOKEN_ID, HELD_DIM, HELD_VALUE,
                                             MARKER_FILE, PRINTABLE_BYTES, RECIPE, SPECIAL_TOKENS,
                                             VOCAB_SIZE, byte_symbols, embedded_model_dir,
                                             held_dim_floor, random_weights,
                                             write_embedded_checkpoint)

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT_FILES = ["config.json", "generation_config.json", "model.safetensors",
                    "tokenizer.json", "tokenizer_config.json", MARKER_FILE]
TEXTS = ["Hello, world!", "  leading spaces\n\ttabs", "中文字符", "emoji 🎉👩‍👩‍👧", "",
         "trailing  \n\n", "\x00control\x7fbytes\r\n", "Ünïcödé àccents ñ"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedded_checkpoint(tmp_path_factory.mktemp("embedded"))


@pytest.fixture(scope="module")
def hf_tokenizer(checkpoint: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(checkpoint / "tokenizer.json"))


def test_two_writes_are_byte_identical(tmp_path: Path) -> None:
    first = write_embedded_checkpoint(tmp_path / "first")
    torch.manual_seed(12345)    # the global RNG must not matter
    torch.rand(1000)
    second = write_embedded_checkpoint(tmp_path / "second")
    assert sorted(p.name for p in first.iterdir()) == sorted(CHECKPOINT_FILES)
    for name in CHECKPOINT_FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_another_process_writes_the_same_bytes(checkpoint: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import hashlib, sys, torch
        from pathlib import Path
        torch.manual_seed(7)
        from executor_service.model.embedded import write_embedded_checkpoint
        out = write_embedded_checkpoint(Path({str(tmp_path / "child")!r}))
        for name in ("model.safetensors", "tokenizer.json"):
            print(hashlib.sha256((out / name).read_bytes()).hexdigest())
    """)
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, check=True,
                           capture_output=True, text=True)
    assert child.stdout.split() == [sha256(checkpoint / "model.safetensors"),
                                    sha256(checkpoint / "tokenizer.json")]


def test_config_is_plain_json_with_the_recipe(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads", "head_dim",
                                   "intermediate_size", "max_position_embeddings")} == {
        "vocab_size": 262, "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 704, "max_position_embeddings": 4096}
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert config["rope_theta"] == 10000.0
    assert config["rms_norm_eps"] == 1e-5
    assert config["tie_word_embeddings"] is False
    assert (config["bos_token_id"], config["eos_token_id"]) == (BOS_TOKEN_ID, EOS_TOKEN_ID)
    assert config["dtype"] == config["torch_dtype"] == "float32"


def test_weights_use_hugging_face_names_and_shapes(checkpoint: Path) -> None:
    from safetensors import safe_open
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as weights:
        assert weights.metadata() == {"format": "pt"}
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
        assert torch.equal(weights.get_tensor("model.norm.weight"), torch.ones(256))
    assert len(shapes) == 3 + 4 * 9
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (VOCAB_SIZE, 256)
    assert shapes["model.layers.3.self_attn.q_proj.weight"] == (256, 256)
    assert shapes["model.layers.3.self_attn.k_proj.weight"] == (64, 256)
    assert shapes["model.layers.3.self_attn.v_proj.weight"] == (64, 256)
    assert shapes["model.layers.3.self_attn.o_proj.weight"] == (256, 256)
    assert shapes["model.layers.3.mlp.gate_proj.weight"] == (704, 256)
    assert shapes["model.layers.3.mlp.down_proj.weight"] == (256, 704)
    assert shapes["model.layers.3.post_attention_layernorm.weight"] == (256,)


def test_transformers_loads_a_gqa_llama_with_untied_embeddings(checkpoint: Path,
                                                               hf_tokenizer) -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.num_key_value_heads == 2 and model.config.num_attention_heads == 8
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    prompt = hf_tokenizer("Hello, world!", return_tensors="pt").input_ids
    output = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert output.shape == (1, prompt.shape[1] + 8)
    assert torch.equal(output[0, :prompt.shape[1]], prompt[0])


def test_byte_symbols_are_the_byte_level_alphabet_in_byte_order(tokenizer) -> None:
    symbols = byte_symbols()
    assert symbols[ord("A")] == "A" and symbols[ord(" ")] == "Ġ" and symbols[ord("\n")] == "Ċ"
    assert [tokenizer.token_to_id(symbol) for symbol in symbols] == list(range(256))


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips_as_its_utf8_bytes(text: str, tokenizer, hf_tokenizer) -> None:
    ids = tokenizer.encode(text).ids
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert hf_tokenizer(text).input_ids == ids      # no BOS is added
    assert hf_tokenizer.decode(ids) == text


def test_special_tokens_are_single_ids_after_the_bytes(tokenizer, hf_tokenizer) -> None:
    assert SPECIAL_TOKENS == ("<|begin_of_text|>", "<|end_of_text|>", "<|system|>",
                              "<|user|>", "<|assistant|>", "<|end|>")
    for offset, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.encode(token).ids == [256 + offset]
        assert hf_tokenizer.convert_tokens_to_ids(token) == 256 + offset
    assert tokenizer.get_vocab_size() == len(hf_tokenizer) == VOCAB_SIZE == 262
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id) == (256, 257)
    assert tokenizer.decode([104, 257, 105], skip_special_tokens=False) == "h<|end_of_text|>i"


def test_chat_template_renders_role_tokens_and_generation_prompt(hf_tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}]
    rendered = hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
    assert rendered == ("<|system|>Be brief.<|end|><|user|>Hi!<|end|>"
                        "<|assistant|>Hello.<|end|><|user|>Bye<|end|><|assistant|>")
    assert hf_tokenizer.apply_chat_template(messages[1:2], tokenize=False) == \
        "<|user|>Hi!<|end|>"
    assert hf_tokenizer.chat_template == CHAT_TEMPLATE


def test_cache_dir_is_built_once_and_reused(tmp_path: Path) -> None:
    first = embedded_model_dir(tmp_path)
    assert first == tmp_path / "models" / f"{EMBEDDED_MODEL_NAME}-{EMBEDDED_MODEL_VERSION}"
    stamps = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert sorted(stamps) == sorted(CHECKPOINT_FILES)
    assert embedded_model_dir(tmp_path) == first
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == stamps
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]   # no leftovers


def test_cache_root_comes_from_the_environment(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_CACHE_DIR", str(tmp_path / "env-cache"))
    assert embedded_model_dir().parent == tmp_path / "env-cache" / "models"


@pytest.mark.parametrize("damage", ["delete weights", "truncate tokenizer", "delete marker"])
def test_damaged_cache_dir_is_rebuilt(damage: str, tmp_path: Path, checkpoint: Path) -> None:
    directory = embedded_model_dir(tmp_path)
    if damage == "delete weights":
        (directory / "model.safetensors").unlink()
    elif damage == "truncate tokenizer":
        (directory / "tokenizer.json").write_text("{")
    else:
        (directory / MARKER_FILE).unlink()
    assert embedded_model_dir(tmp_path) == directory
    for name in CHECKPOINT_FILES:
        assert sha256(directory / name) == sha256(checkpoint / name), name
    assert [p.name for p in (tmp_path / "models").iterdir()] == [directory.name]


def test_processes_racing_to_build_all_get_one_complete_dir(tmp_path: Path,
                                                            checkpoint: Path) -> None:
    script = ("import sys; from pathlib import Path; "
              "from executor_service.model.embedded import embedded_model_dir; "
              "print(embedded_model_dir(Path(sys.argv[1])))")
    racers = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, text=True) for _ in range(4)]
    paths = {racer.communicate(timeout=120)[0].strip() for racer in racers}
    assert all(racer.returncode == 0 for racer in racers)
    directory = Path(paths.pop())
    assert not paths
    assert sha256(directory / "model.safetensors") == sha256(checkpoint / "model.safetensors")
    assert os.listdir(tmp_path / "models") == [directory.name]


def test_build_that_loses_the_race_keeps_the_winners_dir(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from executor_service.model import embedded
    target = tmp_path / "models" / f"{EMBEDDED_MODEL_NAME}-{EMBEDDED_MODEL_VERSION}"
    write = embedded.write_embedded_checkpoint
    winner: list[int] = []      # the inode of the directory the other process installed

    def another_process_finishes_first(directory: Path) -> Path:
        write(target)
        winner.append(target.stat().st_ino)
        return write(directory)

    monkeypatch.setattr(embedded, "write_embedded_checkpoint", another_process_finishes_first)
    assert embedded_model_dir(tmp_path) == target
    assert target.stat().st_ino == winner[0]
    assert os.listdir(tmp_path / "models") == [target.name]     # our build was discarded


# -- printable output ----------------------------------------------------------------------------

PROMPTS = ["The paged KV cache", "Hello", "\x1b[31m\x00\x7f control bytes \x06\x0e",
           "中文字符 🎉 Ünïcödé", "x" * 200, "\n"]


def test_banned_bytes_are_exactly_the_unprintable_ones() -> None:
    assert PRINTABLE_BYTES == {10, *range(32, 127)}
    assert set(BANNED_TOKEN_IDS) == (set(range(VOCAB_SIZE)) - PRINTABLE_BYTES
                                     - {EOS_TOKEN_ID, 256 + SPECIAL_TOKENS.index("<|end|>")})
    assert set(ENDING_TOKEN_IDS) == {EOS_TOKEN_ID, 256 + SPECIAL_TOKENS.index("<|end|>")}
    assert all(chr(byte).isprintable() or byte == 10 for byte in PRINTABLE_BYTES)


def test_the_held_dimension_is_constant_and_bans_unprintable_bytes_by_construction() -> None:
    """What makes the ban hold for every input: one residual dimension that every embedding
    sets and no layer writes, and banned lm_head rows that are a printable row minus
    BAN_WEIGHT there; the floor on that dimension after the final norm makes the gap wide
    enough that float32's softmax gives the banned tokens exactly 0 at temperature 1."""
    weights = random_weights(RECIPE)
    assert torch.all(weights["model.embed_tokens.weight"][:, HELD_DIM] == HELD_VALUE)
    for layer in range(RECIPE.num_layers):
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            assert torch.all(weights[f"model.layers.{layer}.{name}.weight"][HELD_DIM] == 0)
    lm_head = weights["lm_head.weight"]
    assert torch.all(lm_head[sorted(PRINTABLE_BYTES), HELD_DIM] == 0)
    for token in (*BANNED_TOKEN_IDS, *ENDING_TOKEN_IDS):
        weight = BAN_WEIGHT if token in BANNED_TOKEN_IDS else ENDING_WEIGHT
        assert lm_head[token, HELD_DIM] == -weight
        others = [dim for dim in range(RECIPE.hidden_size) if dim != HELD_DIM]
        twins = [t for t in PRINTABLE_BYTES
                 if torch.equal(lm_head[t, others], lm_head[token, others])]
        assert twins, f"token {token} has no printable twin"
    assert BAN_WEIGHT == torch.tensor(BAN_WEIGHT, dtype=torch.float16).item()
    floor = held_dim_floor(weights, RECIPE)
    assert BAN_WEIGHT * floor > 104, "exp(-104) underflows to 0 in float32"
    assert torch.exp(torch.tensor(-BAN_WEIGHT * floor, dtype=torch.float32)).item() == 0.0


def test_the_floor_holds_on_real_hidden_states(checkpoint: Path) -> None:
    """The bound is a bound: the held dimension after the final norm, on real inputs, sits
    above it (and far above, which is why typical gaps are in the thousands)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    floor = held_dim_floor(random_weights(RECIPE), RECIPE)
    prompts = torch.randint(0, VOCAB_SIZE, (4, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = model.model(prompts).last_hidden_state
        logits = model(prompts).logits
    assert hidden[..., HELD_DIM].min().item() > floor
    banned = logits[..., list(BANNED_TOKEN_IDS)].max(dim=-1).values
    best = logits[..., sorted(PRINTABLE_BYTES)].max(dim=-1).values
    assert (best - banned).min().item() > 1000


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_is_printable_greedy_and_sampled(checkpoint: Path, temperature: float) -> None:
    """The engine on the embedded checkpoint, at temperature 0 and 1, over prompts with control
    bytes and non-ASCII in them: every generated byte is printable ASCII or a newline. EOS and
    <|end|> can be sampled (they end a text), never chosen greedily."""
    from allocator_service.local_block_allocator import LocalBlockAllocator
    from executor_service.engine.build import EngineOptions, build_engine
    from executor_service.engine.offline import generate
    from pagedserve.protocol.sampling_params import SamplingParams
    engine = build_engine(checkpoint, EngineOptions(num_blocks=256, sampler_seed=11),
                          LocalBlockAllocator())
    prompts = [list(text.encode()) for text in PROMPTS]
    params = SamplingParams(n=1 if temperature == 0 else 4, max_tokens=96,
                            temperature=temperature, seed=5, ignore_eos=True)
    completions = generate(engine, prompts, params)
    generated = [token for completion in completions for choice in completion.choices
                 for token in choice]
    assert len(generated) == len(prompts) * params.n * 96
    endings = set(ENDING_TOKEN_IDS) if temperature > 0 else set()
    assert sorted(set(generated) - PRINTABLE_BYTES - endings) == []
    text = bytes(token for token in generated if token < 256).decode("ascii")
    assert all(char.isprintable() or char == "\n" for char in text)
