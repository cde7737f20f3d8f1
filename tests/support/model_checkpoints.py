"""Small random checkpoints of every supported architecture, written with transformers'
`save_pretrained` (no weights can be downloaded here), and transformers' own greedy answers for
them: the reference our engine must reproduce token for token."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

VOCAB = 320
COMMON = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
              max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)

# Each covers what the issue asks of its architecture.
ARCHITECTURES = {
    # GQA, llama3 rope scaling (original context short enough that scaling changes the
    # frequencies the test positions use), untied embeddings.
    "llama": (LlamaConfig, dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}, tie_word_embeddings=False)),
    # No sliding window within the served context.
    "mistral": (MistralConfig, dict(sliding_window=None, tie_word_embeddings=False)),
    # q/k/v biases, tied embeddings.
    "qwen2": (Qwen2Config, dict(tie_word_embeddings=True)),
    # q/k norm and a head_dim (32) that is not hidden / heads (16).
    "qwen3": (Qwen3Config, dict(head_dim=32, tie_word_embeddings=True)),
}


def write_checkpoint(architecture: str, directory: Path, seed: int = 0,
                     vocab_size: int = VOCAB) -> Path:
    """A random model whose weights are large enough to give varied greedy text (the default
    init makes nearly uniform logits, where ties would decide tokens)."""
    config_class, extra = ARCHITECTURES[architecture]
    config = config_class(**{**COMMON, "vocab_size": vocab_size}, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                scale = 0.5 if ("embed" in name or "lm_head" in name) else 0.12
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(directory)
    return directory


def transformers_greedy(directory: Path, prompts: list[list[int]], max_new_tokens: int,
                        **generate_options) -> list[list[int]]:
    """transformers' greedy continuation of each prompt on its own (no padding involved),
    never stopping at eos; `generate_options` go to generate (repetition_penalty=...)."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    answers = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0,
                                 **generate_options)
            answers.append(out[0, len(prompt):].tolist())
    return answers


def random_prompts(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=generator).tolist()
            for length in lengths]
