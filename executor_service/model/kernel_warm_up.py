"""Compiling every Triton kernel variant a serving run launches, before the executor serves.

Triton compiles a kernel the first time it meets a new variant: new constexpr values, argument
dtypes, or an integer or pointer property it specialises on. Each compile stalls the GPU for
0.3 to 1 s. The kernels are written so that a serving run meets one variant of each: every
constexpr follows from the model (heads, head_dim, block size, dtype), the decode kernel cuts
every context into the same number of segments on the device (kernels/triton/decode_attention.py),
and the integers that change between batches (block-table strides) are int64 and never
specialised. So one small forward pass with a decode row and a prefill sequence, and one block
copy, compile them all. tests/kernels/test_kernel_variants.py counts the variants the engine
launches while serving and checks this pass produced each of them.

It runs on the fresh cache before any block is granted, and changes nothing in it: its slots
are -1 (store_kv skips them), its attention reads block 0 and its output is dropped, and the
copy moves block 0's zeros onto block 1's.
"""
from __future__ import annotations

import logging
import time

import torch

import kernels
from executor_service.model.attention_batch import AttentionBatch
from executor_service.model.causal_lm import CausalLM

log = logging.getLogger(__name__)

# One decode row and one prefill sequence of two tokens.
WARM_UP_PREFILL_TOKENS = 2


def warm_up_batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
    """(token_ids, positions, batch) of the warm-up pass, laid out as StepInputs lays out a
    mixed batch (attention_batch.py), with the same index dtypes."""
    def int32(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    num_tokens = 1 + WARM_UP_PREFILL_TOKENS
    batch = AttentionBatch(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        num_decode_tokens=1,
        decode_block_tables=int32([[0]]), decode_context_lens=int32([1]), max_decode_context=1,
        prefill_block_tables=int32([[0]]),
        prefill_query_start=int32([0, WARM_UP_PREFILL_TOKENS]),
        prefill_seq_lens=int32([WARM_UP_PREFILL_TOKENS]),
        max_prefill_query=WARM_UP_PREFILL_TOKENS, max_prefill_seq=WARM_UP_PREFILL_TOKENS)
    token_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    positions = torch.tensor([0] + list(range(WARM_UP_PREFILL_TOKENS)), dtype=torch.int64,
                             device=device)
    return token_ids, positions, batch


@torch.inference_mode()
def warm_up_kernels(model: CausalLM, kv_cache: torch.Tensor) -> float:
    """Launches store_kv, both attention kernels and the block copy once each; returns the
    seconds taken (the compiles, on a first start without a Triton cache)."""
    started = time.monotonic()
    token_ids, positions, batch = warm_up_batch(kv_cache.device)
    model(token_ids, positions, kv_cache, batch)
    if kv_cache.shape[2] > 1:
        kernels.copy_blocks(kv_cache, [(0, 1)])
    if kv_cache.is_cuda:
        torch.cuda.synchronize(kv_cache.device)
    seconds = time.monotonic() - started
    log.info("attention kernels compiled (or loaded from the Triton cache) in %.1f s", seconds)
    return seconds
