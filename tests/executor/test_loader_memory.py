"""Loading a checkpoint holds the model in its serving dtype plus one tensor, never more.

Measured, not assumed: each load runs in a fresh Python process that reports its resident set
before the load and its peak (VmHWM) after, and the growth is compared with what the loaded
model occupies. The checkpoint is float32 and sharded (so the index path is what is read); it
is loaded as bfloat16, the case where building the model in float32 first and casting after
would cost three times the model, and mapping each shard whole would add its size again.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from executor_service.model.safetensors_stream import SafetensorsReader

# Big enough that the allocator's and the interpreter's own noise is small beside it: 33.6M
# parameters, 134 MB in float32, 67 MB as bfloat16; the largest tensor (the embeddings) 16 MB.
CONFIG = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=4, vocab_size=8192,
              max_position_embeddings=512, tie_word_embeddings=False)
# What a load may hold beyond the model and its largest tensor: the allocator's rounding and
# the small tensors (norms, rotary tables), about 2 % of the model here.
SLACK_BYTES = 16 << 20

CHILD = """
import json, sys
from pathlib import Path
import torch
from executor_service.model.causal_lm import CausalLM
from executor_service.model.loader import load_model
from executor_service.model.model_config import ModelConfig

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

directory = Path(sys.argv[1])
config = ModelConfig.from_dir(directory)
# Whatever torch imports the first time a module is built on meta is paid here, because it is
# not the load's memory (it was about 150 MB while that build ran an init function and so
# imported torch._dynamo; the loader now avoids that, and sympy, see loader.py).
with torch.device("meta"):
    CausalLM(config)
before = status("VmRSS")
model = load_model(directory, config, getattr(torch, sys.argv[2]), torch.device("cpu"), 512,
                   pack_weights=False)
peak = status("VmHWM")
model_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
print(json.dumps({"growth": peak - before, "model_bytes": model_bytes}))
"""


@pytest.fixture(scope="module")
def float32_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("float32_llama")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG), dtype=torch.float32)
    model.save_pretrained(directory, max_shard_size="40MB")
    return directory


def load_in_child(directory: Path, dtype: str) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, str(directory), dtype],
                            capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def largest_tensor_bytes(directory: Path) -> int:
    """From the shards' headers (only the header is read here)."""
    largest = 0
    for path in directory.glob("*.safetensors"):
        with SafetensorsReader(path) as shard:
            largest = max([largest, *(entry.num_bytes for entry in shard.entries())])
    return largest


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_load_holds_the_model_in_its_dtype_plus_one_tensor(float32_checkpoint: Path,
                                                            dtype: str) -> None:
    assert (float32_checkpoint / "model.safetensors.index.json").exists()   # sharded
    measured = load_in_child(float32_checkpoint, dtype)
    bound = measured["model_bytes"] + largest_tensor_bytes(float32_checkpoint) + SLACK_BYTES
    assert measured["growth"] <= bound, (
        f"loading grew the process by {measured['growth'] / 2**20:.0f} MiB for a "
        f"{measured['model_bytes'] / 2**20:.0f} MiB model (bound {bound / 2**20:.0f} MiB)")
    # And the check can fail: the float32 checkpoint itself is twice the bfloat16 model.
    if dtype == "bfloat16":
        checkpoint_bytes = sum(f.stat().st_size for f in float32_checkpoint.glob("*.safetensors"))
        assert bound < checkpoint_bytes
