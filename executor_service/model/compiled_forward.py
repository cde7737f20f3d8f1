"""The forward pass's tensor math through torch.compile (inductor).

What is compiled: each layer's part before the attention (norm, fused q/k/v, q/k norm, RoPE)
and after it (o_proj, residuals, norm, SwiGLU), and the final norm (CausalLM.segments). The
attention over the paged cache stays eager between them: it is our own kernels, indexed by
block tables whose shapes change every iteration. Each part is one function taking its module
as an argument, so inductor makes one graph for all layers, with their weights as inputs.

Shapes: the token dimension is dynamic. Dynamo specialises a size of 1 on its own, so a
serving run compiles each part twice (one token; two or more), both at start-up: `warm_up`
runs the parts at those sizes before the executor reports SERVING, logging a line per shape.

When: `--compile auto` (the default) compiles on CUDA and runs eagerly on the CPU, where it
measured slower. On the embedded model at 64 decode rows, one thread, the eager pass with
oneDNN-packed linears took 6.9 ms, inductor with its own weight freezing 7.7 ms, and inductor
over plain linears 10.6 ms (docs/kernels.md). The packed linears are opaque to inductor, so a
compiled model keeps plain linears. `--compile on` compiles anywhere (a C++ compiler is then
needed on the CPU); `--compile off` is the eager fallback.
"""
from __future__ import annotations

import logging
import time

import torch

from executor_service.model.causal_lm import CausalLM, DecoderLayer, Segments
from executor_service.model.layers import RMSNorm

COMPILE_CHOICES = ("auto", "on", "off")
# The token counts warm_up runs: the specialised single token, then the dynamic graph.
WARM_UP_TOKENS = (1, 2)

log = logging.getLogger(__name__)


def compile_wanted(choice: str, device: torch.device) -> bool:
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"--compile must be one of {', '.join(COMPILE_CHOICES)}, "
                         f"got {choice!r}")
    if choice == "auto":
        return device.type == "cuda"
    return choice == "on"


def compile_segments(model: CausalLM) -> None:
    def compiled(function):
        return torch.compile(function, backend="inductor", dynamic=True)

    model.segments = Segments(compiled(DecoderLayer.before_attention),
                              compiled(DecoderLayer.after_attention),
                              compiled(RMSNorm.forward), compiled=True)


@torch.inference_mode()
def warm_up(model: CausalLM) -> float:
    """Compiles every part at every shape a serving run meets; returns the seconds taken."""
    config = model.config
    device = model.model.embed_tokens.weight.device
    dtype = model.model.embed_tokens.weight.dtype
    segments = model.segments
    started = time.monotonic()
    for number, tokens in enumerate(WARM_UP_TOKENS, 1):
        log.info("compiling the forward pass (torch.compile, inductor): shape %d of %d, "
                 "%d token%s", number, len(WARM_UP_TOKENS), tokens, "" if tokens == 1 else "s")
        hidden = torch.zeros(tokens, config.hidden_size, dtype=dtype, device=device)
        rotation = model.rotary.rotation(torch.zeros(tokens, dtype=torch.long, device=device),
                                         dtype)
        attended = torch.zeros(tokens, config.num_heads * config.head_dim, dtype=dtype,
                               device=device)
        for layer in model.model.layers:
            segments.before_attention(layer, hidden, rotation)
            hidden = segments.after_attention(layer, attended, hidden)
        segments.final_norm(model.model.norm, hidden)
    seconds = time.monotonic() - started
    log.info("forward pass compiled in %.1f s", seconds)
    return seconds
