"""Prompt logprobs: how likely the model found each prompt token, given the tokens before it.

They come from the prefill's own hidden states. Position p's logits predict token p + 1, so a
prompt of P tokens yields P - 1 scores (the first token has nothing before it); the logits of
the last position are the ones the first output token is sampled from, as for any request.
A prompt computed in chunks is scored chunk by chunk, in order (`Request.prompt_logprobs`
grows until it holds P - 1 entries), and goes out once, whole.

A cached prefix still has to be scored, and its K/V are already in the cache. Such a request
takes its cached blocks like any other (they stay shared) and recomputes the cached tokens
all the same: their queries run through the model against the cached K/V, and their K/V are
not stored again (slot -1, the padding marker: see `Sequence.rescore_below`). It pays the
compute of a cache miss and none of the memory. vLLM v1 instead has such requests skip the
prefix cache altogether, taking fresh blocks for the whole prompt.

The scores are the model's own distribution: a log-softmax of the raw logits, before any
penalty, temperature or truncation (nothing is sampled at these positions). Each reports the
token's logprob, its rank (1: the most likely) and the `prompt_logprobs` most likely tokens.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from executor_service.engine.request import Sequence
from executor_service.engine.request_output import TokenLogprob

# Rows turned into logits at a time: a pass of 2,048 prompt tokens over a 150k vocabulary
# would otherwise hold 1.2 GB of float32 logits at once.
ROWS_PER_PIECE = 256


@dataclass(slots=True)
class PromptSpan:
    """Prompt positions one pass computes whose logits score the next prompt token."""
    seq: Sequence
    first: int    # the first such position: its logits score prompt token first + 1
    count: int
    row: int      # the first position's row in the pass's hidden states


def span_of(seq: Sequence, start: int, chunk: int, row: int) -> PromptSpan | None:
    """The positions of `chunk` tokens from `start` (hidden rows from `row`) still to score;
    None when the request is not scoring its prompt there."""
    request = seq.request
    if not request.scoring_prompt:
        return None
    first = max(start, len(request.prompt_logprobs))
    last = min(start + chunk, len(request.prompt_token_ids) - 1)
    if first >= last:
        return None
    return PromptSpan(seq, first, last - first, row + first - start)


def score(hidden: torch.Tensor, logits_of: Callable[[torch.Tensor], torch.Tensor],
          spans: list[PromptSpan]) -> None:
    """Appends each span's scores to its request's `prompt_logprobs`; `logits_of` maps hidden
    rows to logits (the model's head)."""
    rows = torch.cat([torch.arange(span.row, span.row + span.count) for span in spans])
    # (span, position) of each row, in order.
    owners = [(span, span.first + i) for span in spans for i in range(span.count)]
    targets = torch.tensor([span.seq.request.prompt_token_ids[position + 1]
                            for span, position in owners], dtype=torch.long)
    rows, targets = rows.to(hidden.device), targets.to(hidden.device)
    for begin in range(0, len(owners), ROWS_PER_PIECE):
        end = begin + ROWS_PER_PIECE
        logprobs = torch.log_softmax(logits_of(hidden[rows[begin:end]]).float(), dim=-1)
        wanted = targets[begin:end].unsqueeze(1)
        chosen = logprobs.gather(1, wanted)
        ranks = (logprobs > chosen).sum(dim=-1).add_(1)
        most = max(span.seq.request.params.prompt_logprobs for span, _ in owners[begin:end])
        top_values, top_ids = logprobs.topk(most, dim=-1) if most else (None, None)
        chosen, ranks = chosen.squeeze(1).tolist(), ranks.tolist()
        top_values = top_values.tolist() if most else None
        top_ids = top_ids.tolist() if most else None
        for i, (span, position) in enumerate(owners[begin:end]):
            request = span.seq.request
            k = request.params.prompt_logprobs
            top = list(zip(top_ids[i][:k], top_values[i][:k])) if k else []
            request.prompt_logprobs.append(TokenLogprob(
                request.prompt_token_ids[position + 1], chosen[i], top, rank=ranks[i]))
