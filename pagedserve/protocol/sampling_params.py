"""How one request wants its tokens chosen, and the ranges the engine accepts.

Conventions a client might expect otherwise:

- `temperature == 0` means greedy. The sampler also treats temperatures below
  `GREEDY_BELOW_TEMPERATURE` as greedy: dividing logits by them overflows float32.
- `top_k == 0` is the only "off" value. vLLM's `-1` is rejected rather than accepted as a
  synonym, so one setting has one spelling; the gateway maps an API's off value to 0.
- `repetition_penalty` lies in [0.01, 100]: a factor of 100 either way already bans or forces a
  repeat, and the bound keeps penalised logits finite.
- `logprobs` is the number of top alternatives reported per generated token, at most
  `MAX_LOGPROBS`; 0 reports only the chosen token's logprob, None reports nothing.
- `prompt_logprobs` asks for the log-probability of every prompt token after the first (given
  the tokens before it) and this many most likely alternatives at each position, at most
  `MAX_LOGPROBS`; None: none. The engine reads them off the prefill's logits
  (executor_service/engine/prompt_logprobs.py).
- `beam_width` k > 0 asks for beam search (executor_service/engine/beam_search.py) and `n` of
  its hypotheses. It scores by the model's own log-probabilities, as transformers' beam search
  without sampling does, so the sampling fields must be left at their defaults (temperature
  1.0 or 0, both meaning "the model's distribution"); setting one is refused rather than
  ignored. `length_penalty` and `early_stopping` mean what they mean in transformers and apply
  to beam search only.
- `best_of` > n samples that many completions and returns the n with the highest cumulative
  log-probability (the sum of the logprobs the `logprobs` field reports: the model's
  distribution after penalties, before temperature and truncation). It needs sampling: with
  temperature 0 every sample would be the same one, so that is refused.
- `structured` constrains the output to a JSON schema, a regex, a choice or a grammar
  (pagedserve/protocol/structured_output.py; the executor's grammar engine masks every token).
  Beam search compares beams by the model's unconstrained scores, so the two are refused together.
- `logit_bias` is OpenAI's: (token id, bias in [-100, 100]) pairs added to the logits.
  `allowed_token_ids` is vLLM's: when non-empty, only these tokens may be sampled. Both apply
  before the penalties (executor_service/engine/sampler.py gives the whole order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.structured_output import STRUCTURED_KINDS, StructuredOutput

MAX_N = 128
# Every API's default when a request does not say (OpenAI's for completions).
DEFAULT_MAX_TOKENS = 16
MAX_TEMPERATURE = 100.0
GREEDY_BELOW_TEMPERATURE = 1e-5
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0
# OpenAI's range for presence_penalty and frequency_penalty.
MAX_ABS_PRESENCE_FREQUENCY = 2.0
# OpenAI's cap on top_logprobs; each one costs a top-k over the vocabulary and bytes on the wire.
MAX_LOGPROBS = 20
# OpenAI's range for a logit_bias value: -100 bans a token, +100 all but forces it.
MAX_ABS_LOGIT_BIAS = 100.0
MAX_SEED = 2**63 - 1  # a torch.Generator seed is a 64-bit integer; 63 bits keep it positive
# transformers' three early_stopping settings for beam search.
EarlyStopping = bool | Literal["never"]


class InvalidSamplingParams(InvalidArgument, ValueError):
    """A sampling field out of range. A ValueError to Python callers, INVALID_ARGUMENT on the wire."""


@dataclass(slots=True, frozen=True)
class SamplingParams:
    # Completions to generate for the prompt; the engine forks the request into n sequences.
    n: int = 1
    # Generated tokens at most, not counting the prompt.
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    # Keep only the k most likely tokens; 0 keeps all.
    top_k: int = 0
    # Keep the smallest set of most likely tokens whose probability mass reaches top_p.
    top_p: float = 1.0
    # Drop tokens less likely than min_p times the most likely one.
    min_p: float = 0.0
    # Makes the request's tokens reproducible, whatever else shares its batches.
    seed: int | None = None
    # HF semantics over prompt and output tokens: positive logits divided, negative multiplied.
    repetition_penalty: float = 1.0
    # OpenAI semantics over output tokens: logit -= presence * (count > 0) + frequency * count.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Generating any of these finishes the sequence with reason "stop".
    stop_token_ids: tuple[int, ...] = ()
    # Keep generating past the model's end-of-sequence tokens (stop_token_ids still stop).
    ignore_eos: bool = False
    logprobs: int | None = None
    # Score the prompt: each prompt token's logprob and this many alternatives; None: no.
    prompt_logprobs: int | None = None
    # Beam search with this many beams; 0: sampling (or greedy) as the fields above say.
    beam_width: int = 0
    # Beam search: a hypothesis scores sum(logprobs) / generated_length ** length_penalty.
    length_penalty: float = 1.0
    # Beam search: stop once `beam_width` hypotheses are finished (True), when the heuristic
    # says none can improve (False), or only when none can (the "never" setting).
    early_stopping: EarlyStopping = False
    # Sample this many completions (at least n) and return the n most likely; None: n.
    best_of: int | None = None
    # The form the output must take (JSON schema, regex, choice, grammar); None: free text.
    structured: StructuredOutput | None = None
    # (token id, bias) pairs added to the logits before sampling (OpenAI's logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # When non-empty, only these tokens may be sampled (vLLM's allowed_token_ids).
    allowed_token_ids: tuple[int, ...] = ()

    @property
    def beam_search(self) -> bool:
        return self.beam_width > 0

    @property
    def ranks_samples(self) -> bool:
        """Whether more completions are sampled than returned (best_of > n): then the choices
        are decided only when every sample has finished."""
        return self.best_of is not None and self.best_of > self.n

    @property
    def num_sequences(self) -> int:
        """The sequences the request runs at once: its beams, its best_of samples, or its n
        choices."""
        if self.beam_search:
            return self.beam_width
        return self.best_of if self.ranks_samples else self.n

    @property
    def needs_token_logprobs(self) -> bool:
        """Whether the sampler must report each chosen token's logprob: asked for, or summed
        to rank best_of samples."""
        return self.logprobs is not None or self.ranks_samples

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        """Whether sampling reads the tokens generated so far (repetition, presence or
        frequency penalties)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def validate(self, vocab_size: int) -> None:
        """Raises InvalidSamplingParams naming the first field out of range and its range."""
        # Each check states what must hold, so NaN (false in every comparison) fails it.
        _check(1 <= self.n <= MAX_N, f"n must be between 1 and {MAX_N}, got {self.n}")
        _check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(self.temperature <= MAX_TEMPERATURE,
               f"temperature must be <= {MAX_TEMPERATURE:g}, got {self.temperature}")
        _check(0 <= self.top_k <= vocab_size,
               f"top_k must be between 0 (off) and the vocabulary size {vocab_size}, "
               f"got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        _check(self.seed is None or 0 <= self.seed <= MAX_SEED,
               f"seed must be between 0 and 2**63-1, got {self.seed}")
        _check(MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
               f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, "
               f"{MAX_REPETITION_PENALTY:g}], got {self.repetition_penalty}")
        bound = MAX_ABS_PRESENCE_FREQUENCY
        _check(-bound <= self.presence_penalty <= bound,
               f"presence_penalty must be in [-{bound:g}, {bound:g}], got {self.presence_penalty}")
        _check(-bound <= self.frequency_penalty <= bound,
               f"frequency_penalty must be in [-{bound:g}, {bound:g}], "
               f"got {self.frequency_penalty}")
        for token_id in self.stop_token_ids:
            _check(0 <= token_id < vocab_size,
                   f"stop_token_ids must be in [0, {vocab_size}), got {token_id}")
        _check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
               f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        _check(self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
               f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got "
               f"{self.prompt_logprobs}")
        _check(self.best_of is None or self.n <= self.best_of <= MAX_N,
               f"best_of must be between n ({self.n}) and {MAX_N}, got {self.best_of}")
        _check(not self.ranks_samples or self.temperature > 0,
               f"best_of ({self.best_of}) above n needs sampling (temperature > 0): greedy "
               "samples are all the same")
        self._validate_constraints(vocab_size)
        _check(isinstance(self.early_stopping, bool) or self.early_stopping == "never",
               f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}")
        _check(math.isfinite(self.length_penalty),
               f"length_penalty must be a finite number, got {self.length_penalty}")
        if self.beam_search:
            self._validate_beam_search()
        else:
            _check(self.beam_width == 0, f"beam_width must be >= 0, got {self.beam_width}")
            _check(self.length_penalty == 1.0 and self.early_stopping is False,
                   "length_penalty and early_stopping apply only to beam search "
                   "(set beam_width)")

    def _validate_constraints(self, vocab_size: int) -> None:
        """logit_bias, allowed_token_ids and structured: what they name exists."""
        for token_id, bias in self.logit_bias:
            _check(0 <= token_id < vocab_size,
                   f"logit_bias token ids must be in [0, {vocab_size}), got {token_id}")
            _check(-MAX_ABS_LOGIT_BIAS <= bias <= MAX_ABS_LOGIT_BIAS,
                   f"logit_bias values must be in [-{MAX_ABS_LOGIT_BIAS:g}, "
                   f"{MAX_ABS_LOGIT_BIAS:g}], got {bias} for token {token_id}")
        for token_id in self.allowed_token_ids:
            _check(0 <= token_id < vocab_size,
                   f"allowed_token_ids must be in [0, {vocab_size}), got {token_id}")
        if self.structured is not None:
            _check(self.structured.kind in STRUCTURED_KINDS,
                   f"structured output kind must be one of {', '.join(STRUCTURED_KINDS)}, "
                   f"got {self.structured.kind!r}")
            _check(not self.beam_search, "structured output is not supported with beam search "
                   "(beams are ranked by the unconstrained model's scores)")

    def _validate_beam_search(self) -> None:
        _check(self.n <= self.beam_width,
               f"n ({self.n}) must not exceed beam_width ({self.beam_width}): beam search "
               "returns at most its beams")
        _check(self.best_of is None, "best_of does not combine with beam search")
        _check(self.prompt_logprobs is None, "prompt_logprobs is not supported with beam "
               "search (as in vLLM): score the prompt in a request of its own")
        defaults = SamplingParams()
        for name in ("top_k", "top_p", "min_p", "seed", "repetition_penalty",
                     "presence_penalty", "frequency_penalty", "logprobs", "logit_bias",
                     "allowed_token_ids"):
            _check(getattr(self, name) == getattr(defaults, name),
                   f"{name} is not supported with beam search (it scores by the model's "
                   "log-probabilities)")
        _check(self.temperature in (0.0, 1.0),
               f"temperature is not supported with beam search (got {self.temperature}; "
               "only 1.0 or 0, both the model's own distribution)")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidSamplingParams(message)
