"""Whether a sequence is finished after its latest token, and why (OpenAI's finish_reason)."""
from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from pagedserve.protocol.sampling_params import SamplingParams

FinishReason = Literal["stop", "length"]


def finish_reason(params: SamplingParams, output_token_ids: Sequence[int],
                  eos_token_ids: Collection[int], *, num_tokens: int,
                  max_model_len: int) -> FinishReason | None:
    """"stop", "length" or None (keep going), judged on the last generated token.

    `num_tokens` counts prompt and output; the context window is full when it reaches
    `max_model_len`. A stop token wins over a length limit reached by the same token (as in vLLM),
    since the client asked for exactly that end. `ignore_eos` skips only the model's eos tokens:
    ids listed in `stop_token_ids` stop even when they are also eos tokens.
    """
    if output_token_ids:
        last = output_token_ids[-1]
        if last in params.stop_token_ids or (not params.ignore_eos and last in eos_token_ids):
            return "stop"
    if len(output_token_ids) >= params.max_tokens or num_tokens >= max_model_len:
        return "length"
    return None
