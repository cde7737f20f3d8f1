"""Beam search for one request: which k continuations survive each step, and which finished
hypotheses are kept. Pure decision logic over log-probabilities; the engine turns the decisions
into block operations (a surviving beam goes on, a beam chosen twice is forked, a beam chosen by
no one is freed: see engine.py).

It follows transformers' `generate(num_beams=k, do_sample=False)` step for step, with the same
tensor operations in the same order, so ties between equal scores break the same way:

1. Every beam's log-softmax plus the beam's running score (its tokens' summed log-probabilities)
   is one row of [k, vocab]; the best `keep` = max(2, 1 + stop tokens) * k of all k * vocab
   continuations are the candidates, best first (enough that k of them do not stop even if the
   best all do).
2. A candidate "hits" when its token is a stop token or it reaches the length limit. The next
   beams are the k best candidates that do not hit.
3. Candidates among the first k that hit become finished hypotheses scored
   sum_logprob / generated_length ** length_penalty, merged with the k best kept so far. No more
   are taken once k are finished with `early_stopping=True`, or once the heuristic below says
   none can improve on them.
4. The heuristic: with every kept slot finished, stop taking hypotheses (and stop the search)
   when the best running beam's score, penalised as if it ended now (or, with
   `early_stopping="never"` and a positive length penalty, at the length limit), cannot beat
   the worst kept one.
5. The search ends when the heuristic is satisfied, when all k slots are finished under
   `early_stopping=True`, or when every candidate hits (the length limit).

At the first step all k beams are the prompt, with running scores 0 and -1e9 for the others,
so only the first contributes candidates, as in transformers.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from executor_service.engine.request_output import TokenLogprob
from pagedserve.protocol.sampling_params import EarlyStopping

# transformers' stand-in for "minus infinity" in scores: added, not assigned, so an excluded
# entry still orders as the arithmetic gives it.
EXCLUDED = -1.0e9


@dataclass(slots=True)
class Hypothesis:
    """A finished beam: the tokens it generated (the stop token included), its summed
    log-probability and its length-penalised score. The engine also ranks best_of samples as
    hypotheses (scored by the summed log-probability), with their tokens' logprobs when the
    request asks for them."""
    token_ids: list[int]
    cumulative_logprob: float
    score: float
    finish_reason: str                   # "stop" or "length"
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class Continuation:
    """One of the next beams: which current beam it extends (its position in the beams the
    step was given), with which token, and its running score afterwards."""
    parent: int
    token_id: int
    cumulative_logprob: float


class BeamSearch:
    def __init__(self, width: int, *, length_penalty: float, early_stopping: EarlyStopping,
                 num_prompt_tokens: int, max_length: int, stop_token_ids: Collection[int],
                 device: torch.device | str = "cpu") -> None:
        """`max_length` counts prompt and output tokens (transformers' max_length)."""
        self.width = width
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.num_prompt_tokens = num_prompt_tokens
        self.max_length = max_length
        self.stop_token_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.long,
                                           device=device)
        self.keep = max(2, 1 + len(stop_token_ids)) * width
        self.top_width_mask = (torch.arange(self.keep, device=device) < width).reshape(1, -1)
        # The running beams' scores, best first; the first step's beams are all the prompt.
        self.running_scores = torch.full((1, width), EXCLUDED, device=device)
        self.running_scores[0, 0] = 0.0
        # The kept hypotheses, best first: a slot is a placeholder until a hypothesis fills it.
        self.kept_scores = torch.full((1, width), EXCLUDED, device=device)
        self.kept_finished = torch.zeros((1, width), dtype=torch.bool, device=device)
        self.kept: list[Hypothesis | None] = [None] * width
        self.length = num_prompt_tokens            # prompt plus tokens each running beam has
        self.improvable = True                     # the heuristic of step 4 not yet satisfied
        self.done = False

    def step(self, log_probs: torch.Tensor,
             generated: Sequence[Sequence[int]]) -> list[Continuation]:
        """One decision: `log_probs` [k, vocab] (float32 log-softmax of each running beam's
        next-token logits, in the order of the last step's continuations) and each beam's
        generated tokens. Returns the next k beams, best first, or [] when the search is over
        (`done`; the hypotheses are in `best`)."""
        assert not self.done and log_probs.shape[0] == self.width == len(generated)
        vocab = log_probs.shape[1]
        # Shaped [1, ...] as transformers' [batch, ...], so every topk runs the same kernel.
        accumulated = (log_probs + self.running_scores.reshape(-1, 1)).reshape(1, -1)
        top_scores, top_indices = torch.topk(accumulated, k=self.keep)
        parents = top_indices // vocab
        tokens = top_indices % vocab
        hits = torch.isin(tokens, self.stop_token_ids)
        if self.length + 1 >= self.max_length:
            hits = torch.ones_like(hits)

        # 2. The next running beams.
        running = top_scores + hits.to(torch.float32) * EXCLUDED
        chosen = torch.topk(running, k=self.width)[1]
        self.running_scores = running.gather(1, chosen)

        # 3. Finished hypotheses, merged with the kept ones.
        just_finished = hits & self.top_width_mask
        finished_scores = top_scores / ((self.length + 1 - self.num_prompt_tokens)
                                        ** self.length_penalty)
        full = bool(self.kept_finished.all()) and self.early_stopping is True
        finished_scores = finished_scores + float(full) * EXCLUDED
        finished_scores = finished_scores + float(not self.improvable) * EXCLUDED
        finished_scores = finished_scores + (~just_finished) * EXCLUDED
        merged_scores = torch.cat((self.kept_scores, finished_scores), dim=1)
        merged_finished = torch.cat((self.kept_finished, just_finished), dim=1)
        merged = torch.topk(merged_scores, k=self.width)[1]
        parents_list, tokens_list = parents[0].tolist(), tokens[0].tolist()
        top_list = top_scores[0].tolist()
        merged_scores_list, merged_finished_list = merged_scores[0].tolist(), \
            merged_finished[0].tolist()
        stops = set(self.stop_token_ids.tolist())
        kept: list[Hypothesis | None] = []
        for index in merged[0].tolist():
            if index < self.width:
                kept.append(self.kept[index])
            elif merged_finished_list[index]:
                candidate = index - self.width
                token = tokens_list[candidate]
                kept.append(Hypothesis([*generated[parents_list[candidate]], token],
                                       top_list[candidate], merged_scores_list[index],
                                       "stop" if token in stops else "length"))
            else:
                kept.append(None)
        self.kept = kept
        self.kept_scores = merged_scores.gather(1, merged)
        self.kept_finished = merged_finished.gather(1, merged)

        # 4. and 5.
        self.length += 1
        self.improvable = self.improvable and self._improvable()
        open_slots = not (bool(self.kept_finished.all()) and self.early_stopping is True)
        self.done = not (self.improvable and open_slots and not bool(hits.all()))
        if self.done:
            return []
        scores = self.running_scores[0].tolist()
        return [Continuation(parents_list[i], tokens_list[i], scores[j])
                for j, i in enumerate(chosen[0].tolist())]

    def _improvable(self) -> bool:
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_length - self.num_prompt_tokens
        else:
            best_length = self.length - self.num_prompt_tokens
        best_running = self.running_scores[:, :1] / (best_length ** self.length_penalty)
        worst_kept = torch.where(self.kept_finished,
                                 torch.min(self.kept_scores, dim=1, keepdim=True)[0], EXCLUDED)
        return bool(torch.any(best_running > worst_kept))

    def best(self, n: int) -> list[Hypothesis]:
        """The n best hypotheses, best first (after the search is done every slot is filled)."""
        return [hypothesis for hypothesis in self.kept[:n] if hypothesis is not None]
