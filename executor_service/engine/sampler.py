"""Chooses every running sequence's next token from its logits: one call per engine iteration.

Each row goes through these steps, in the order vLLM and HF transformers use:

0. Constraints, as vLLM's v1 sampler orders them: the structured-output grammar's mask
   (token_mask.py; vLLM applies it in the model runner, before the sampler), then
   allowed_token_ids (every other token to -inf), then logit_bias (added). Only then the
   penalties, so a bias moves the logit a penalty then scales, as in vLLM. Where we differ:
   vLLM takes logprobs from the raw logits, before all of this; ours come after step 1 (below)
   and so after the constraints too, describing the distribution actually sampled from. A
   constrained token's logprob is -inf, and the chosen token's is always finite.
1. Penalties. Repetition (HF): for every token in the prompt or the output, a positive logit is
   divided by the penalty and a negative one multiplied. Then presence and frequency (OpenAI),
   over output tokens only: logit -= presence * (count > 0) + frequency * count.
2. Logprobs, for rows that ask: log_softmax of the penalised logits, taken before temperature
   and truncation. They describe the distribution the model (with penalties) proposes, so they
   do not move with temperature and a token cut by top-k still gets a finite value.
3. Greedy rows (temperature below GREEDY_BELOW_TEMPERATURE) take the argmax; ties go to the
   lowest token id, as torch.argmax returns the first maximal index.
4. Other rows: divide by temperature, keep the top_k best, then the smallest best-first set whose
   probability mass (renormalised after top-k) reaches top_p, then drop tokens whose probability
   is below min_p times the best one's. Then one draw.

The draw is an exponential race: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is token i
with probability p_i (E_i / p_i ~ Exp(p_i), and the smallest of independent exponentials is
the i-th with probability p_i / sum p). Its randomness is one noise vector per row, so a seeded
sequence draws its row from its own generator and its tokens do not depend on what else is in
the batch or where: reproducible on the same device and torch build. Unseeded rows share the
sampler's generator.

Everything is vectorised over rows; Python loops run over rows only, to stack the penalties'
token counts (kept per sequence as tokens arrive: token_counts.py) and to draw from
per-sequence generators.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from executor_service.engine.token_counts import TokenCounts
from pagedserve.protocol.sampling_params import GREEDY_BELOW_TEMPERATURE, MAX_SEED, SamplingParams


@dataclass(slots=True)
class SamplingRow:
    """One sequence that needs its next token."""
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    # The tokens generated so far; read only by the penalties (the engine passes () for a row
    # whose params have none, sparing a copy of every output every iteration).
    output_token_ids: Sequence[int]
    # The sequence's own generator when its request has a seed, on the logits' device (see
    # make_generator); it lives as long as the sequence. None: the sampler's shared generator.
    generator: torch.Generator | None = None
    # The penalties' token counts, kept by the engine as tokens arrive (token_counts.py);
    # None: counted from the two lists above.
    counts: TokenCounts | None = None
    # Structured output: the tokens the grammar allows next, one bit per id in int32 words
    # ([ceil(vocab / 32)], on the CPU: token_mask.py); None: unconstrained.
    token_mask: torch.Tensor | None = None


@dataclass(slots=True)
class TokenLogprobs:
    # Log-probability of the token that was chosen.
    logprob: float
    # The params.logprobs most likely (token_id, logprob) pairs, best first.
    top: list[tuple[int, float]]


@dataclass(slots=True)
class SampleOutput:
    # Row i's next token.
    token_ids: list[int]
    # Row i's logprobs; None where its params need none (needs_token_logprobs).
    logprobs: list[TokenLogprobs | None]


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A seeded sequence's generator. On CUDA a generator must live on the logits' device."""
    return torch.Generator(device=device).manual_seed(seed)


def child_seed(seed: int, index: int) -> int:
    """Seed of completion `index` of a seeded request with n > 1 completions.

    Child 0 keeps the request's seed, so the first of n completions equals the n=1 answer. The
    others hash (seed, index) with BLAKE2b into 63 bits: stable across processes (unlike hash()),
    and unlike seed + index, child 1 of seed 5 is not child 0 of seed 6.
    """
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & MAX_SEED


class Sampler:
    def __init__(self, seed: int | None = None) -> None:
        # Seeds the shared generator of unseeded rows: fixed in tests, from the OS otherwise.
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SampleOutput:
        """Next token (and logprobs where asked) for each row; `logits` is [len(rows), vocab]."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [rows={len(rows)}, vocab], got {tuple(logits.shape)}")
        if not rows:
            return SampleOutput([], [])
        # A float32 copy: bf16 loses the small differences top-p and min-p compare, and every
        # step below works in place.
        logits = logits.to(torch.float32, copy=True)
        device = logits.device
        apply_constraints(logits, rows)
        apply_penalties(logits, rows)

        logprob_rows = [i for i, row in enumerate(rows) if row.params.needs_token_logprobs]
        logprobs = (torch.log_softmax(logits[_index(logprob_rows, device)], dim=-1)
                    if logprob_rows else None)

        greedy: list[int] = []
        random: list[int] = []
        for i, row in enumerate(rows):
            (greedy if row.params.temperature < GREEDY_BELOW_TEMPERATURE else random).append(i)
        if not random:
            token_ids = logits.argmax(dim=-1)
        else:
            token_ids = torch.empty(len(rows), dtype=torch.long, device=device)
            if greedy:
                index = _index(greedy, device)
                token_ids[index] = logits[index].argmax(dim=-1)
            index = _index(random, device)
            token_ids[index] = self._draw(logits[index], [rows[i] for i in random])

        return SampleOutput(token_ids.tolist(),
                            _gather_logprobs(logprobs, token_ids, rows, logprob_rows))

    def _draw(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """One token per row of `logits` (non-greedy rows only), after temperature and truncation."""
        device, vocab = logits.device, logits.shape[1]
        logits.div_(_column([row.params.temperature for row in rows], device))
        top_k = [row.params.top_k or vocab for row in rows]
        # top_p == 1 must cut nothing, but a float32 cumsum can reach 1 before the tail ends.
        top_p = [row.params.top_p if row.params.top_p < 1 else float("inf") for row in rows]
        if min(top_k) < vocab or min(top_p) < 1:
            _truncate_top_k_top_p(logits, top_k, top_p)
        probs = logits.softmax(dim=-1)
        min_p = [row.params.min_p for row in rows]
        if max(min_p) > 0:
            floor = _column(min_p, device) * probs.amax(dim=-1, keepdim=True)
            probs.masked_fill_(probs < floor, 0.0)
        # No renormalising: argmax(p / E) does not change when a row of p is scaled.
        return probs.div_(self._exponential_noise(probs, rows)).argmax(dim=-1)

    def _exponential_noise(self, probs: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        noise = torch.empty_like(probs)
        shared = [i for i, row in enumerate(rows) if row.generator is None]
        generator = self._shared_generator(probs.device)
        if len(shared) == len(rows):
            noise.exponential_(generator=generator)
        elif shared:
            noise[_index(shared, probs.device)] = torch.empty(
                len(shared), probs.shape[1], device=probs.device).exponential_(generator=generator)
        for i, row in enumerate(rows):
            if row.generator is not None:
                noise[i].exponential_(generator=row.generator)
        # A zero draw would turn a cut token's 0 / 0 into NaN, which argmax takes for a maximum.
        return noise.clamp_(min=torch.finfo(torch.float32).tiny)

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(self._seed)
            self._generators[device] = generator
        return generator


def apply_constraints(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """The grammar masks, allowed_token_ids and logit_bias, in place on float32 [rows, vocab]."""
    device, vocab = logits.device, logits.shape[1]
    masked = [i for i, row in enumerate(rows) if row.token_mask is not None]
    if masked:
        index = _index(masked, device)
        bitmask = torch.stack([rows[i].token_mask for i in masked]).to(device, non_blocking=True)
        logits[index] = logits[index].masked_fill_(~unpack_bitmask(bitmask, vocab),
                                                   float("-inf"))
    for i, row in enumerate(rows):
        if row.params.allowed_token_ids:
            allowed = torch.zeros(vocab, dtype=torch.bool, device=device)
            allowed[_index(row.params.allowed_token_ids, device)] = True
            logits[i].masked_fill_(~allowed, float("-inf"))
        if row.params.logit_bias:
            ids, biases = zip(*row.params.logit_bias)
            logits[i].index_add_(0, _index(ids, device),
                                 torch.tensor(biases, dtype=torch.float32, device=device))


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, words] int32 bitmask (bit b of word w is token 32 * w + b) -> [rows, vocab] bool."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    # An arithmetic shift of a negative word still leaves its bit b in place at bit 0.
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1
    return allowed.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_penalties(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Repetition, then presence and frequency penalties, in place on float32 [rows, vocab]."""
    device, vocab = logits.device, logits.shape[1]
    repeating = [i for i, row in enumerate(rows) if row.params.repetition_penalty != 1]
    if repeating:
        index = _index(repeating, device)
        subset = logits[index]
        seen = torch.stack([_counts(rows[i], vocab, device).seen() for i in repeating])
        penalty = _column([rows[i].params.repetition_penalty for i in repeating], device)
        penalised = torch.where(subset < 0, subset * penalty, subset / penalty)
        logits[index] = torch.where(seen, penalised, subset)
    counting = [i for i, row in enumerate(rows)
                if row.params.presence_penalty != 0 or row.params.frequency_penalty != 0]
    if counting:
        index = _index(counting, device)
        counts = torch.stack([_counts(rows[i], vocab, device).output for i in counting])
        presence = _column([rows[i].params.presence_penalty for i in counting], device)
        frequency = _column([rows[i].params.frequency_penalty for i in counting], device)
        logits[index] -= presence * (counts > 0) + frequency * counts


def _counts(row: SamplingRow, vocab: int, device: torch.device) -> TokenCounts:
    """The row's kept counts (the engine's), else counts of its token lists."""
    if row.counts is not None:
        return row.counts
    return TokenCounts.of(vocab, row.prompt_token_ids, row.output_token_ids, device)


# Below this many candidates per row (and when every truncated row has a top_k), top-k and
# top-p look at the candidates only (_truncate_small_k); otherwise the whole vocabulary is
# sorted. A full sort of a 32k vocabulary costs ~1 ms a row on one core; topk of 50 a tenth.
SMALL_TOP_K = 1024


def _truncate_top_k_top_p(logits: torch.Tensor, top_k: Sequence[int],
                          top_p: Sequence[float]) -> None:
    """Sets cut tokens' logits to -inf in place: top-k keeps exactly k tokens and a tie at the
    boundary goes to the lower token id; then top-p over the kept mass."""
    vocab = logits.shape[1]
    if max(top_k) <= min(SMALL_TOP_K, vocab // 2):
        _truncate_small_k(logits, top_k, top_p)
    else:
        _truncate_sorted(logits, top_k, top_p)


def _truncate_sorted(logits: torch.Tensor, top_k: Sequence[int],
                     top_p: Sequence[float]) -> None:
    """On a best-first stable sort of the whole vocabulary."""
    device, vocab = logits.device, logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=device)
    cut = rank >= torch.tensor(top_k, device=device).unsqueeze(1)
    if min(top_p) < 1:
        _cut_top_p(sorted_logits, cut, top_p)
    cut[:, 0] = False  # the best token always stays
    logits.masked_fill_(torch.empty_like(cut).scatter_(1, order, cut), float("-inf"))


def _truncate_small_k(logits: torch.Tensor, top_k: Sequence[int],
                      top_p: Sequence[float]) -> None:
    """The same cut as _truncate_sorted, looking at each row's k best only. topk's order
    among equal values is unspecified, so it only supplies each row's k-th best value; the
    kept set is every token above it plus the lowest-id ties up to k, and the candidates are
    then put in the stable sort's order (value descending, id ascending) to apply top-p."""
    device, vocab = logits.device, logits.shape[1]
    k = torch.tensor(top_k, device=device).unsqueeze(1)
    widest = max(top_k)
    kth = logits.topk(widest, dim=-1).values.gather(1, k - 1)
    above = logits > kth
    ties = logits == kth
    room = k - above.sum(dim=-1, keepdim=True)
    keep = above | (ties & (ties.cumsum(dim=-1) <= room))
    if min(top_p) < 1:
        # The kept ids in ascending order (a unique key per token: larger for lower ids),
        # then sorted best first; a stable sort keeps ascending ids among equal values.
        ids = torch.arange(vocab, device=device)
        key = torch.where(keep, vocab - ids, -1)
        candidates = key.topk(widest, dim=-1).values.neg_().add_(vocab)   # ids, or vocab + 1
        valid = candidates < vocab
        candidates.clamp_(max=vocab - 1)
        values = logits.gather(1, candidates).masked_fill_(~valid, float("-inf"))
        values, order = values.sort(dim=-1, descending=True, stable=True)
        candidates, valid = candidates.gather(1, order), valid.gather(1, order)
        cut = ~valid
        _cut_top_p(values, cut, top_p)
        cut[:, 0] = False
        # Padding entries point at the last id too: adding their 0 leaves it as it is.
        survivors = (~cut & valid).to(torch.int8)
        keep = torch.zeros_like(keep, dtype=torch.int8).scatter_add_(1, candidates,
                                                                      survivors) > 0
    logits.masked_fill_(~keep, float("-inf"))


def _cut_top_p(sorted_logits: torch.Tensor, cut: torch.Tensor, top_p: Sequence[float]) -> None:
    """Adds to `cut` (best first, like `sorted_logits`) the tokens top-p drops: a token stays
    while the better ones left by `cut` hold less than top_p of their mass."""
    sorted_probs = sorted_logits.masked_fill(cut, float("-inf")).softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    cut |= mass_before >= _column(top_p, sorted_logits.device)


def _gather_logprobs(logprobs: torch.Tensor | None, token_ids: torch.Tensor,
                     rows: Sequence[SamplingRow],
                     logprob_rows: Sequence[int]) -> list[TokenLogprobs | None]:
    result: list[TokenLogprobs | None] = [None] * len(rows)
    if logprobs is None:
        return result
    chosen_ids = token_ids[_index(logprob_rows, logprobs.device)].unsqueeze(1)
    chosen = logprobs.gather(1, chosen_ids).squeeze(1).tolist()
    most = max(rows[i].params.logprobs or 0 for i in logprob_rows)
    top_values, top_ids = logprobs.topk(most, dim=-1)  # sorted, best first
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    for j, i in enumerate(logprob_rows):
        n = rows[i].params.logprobs or 0
        result[i] = TokenLogprobs(chosen[j], list(zip(top_ids[j][:n], top_values[j][:n])))
    return result


def _index(rows: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)


def _column(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """Per-row values as a [rows, 1] float32 tensor, to broadcast over the vocabulary."""
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)
