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
    last = output_token_ids[-1] if output_token_ids else None
    return finish_reason_after(params, last, len(output_token_ids), eos_token_ids,
                               num_tokens=num_tokens, max_model_len=max_model_len)


def finish_reason_after(params: SamplingParams, last_token: int | None, num_output_tokens: int,
                        eos_token_ids: Collection[int], *, num_tokens: int,
                        max_model_len: int) -> FinishReason | None:
    """finish_reason from the last token and the output's length: what the engine asks after
    every sampled token, without copying the output out of the sequence."""
    if last_token is not None and (last_token in params.stop_token_ids or (
            not params.ignore_eos and last_token in eos_token_ids)):
        return "stop"
    if num_output_tokens >= params.max_tokens or num_tokens >= max_model_len:
        return "length"
    return None
