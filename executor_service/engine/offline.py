"""Running an engine to completion over a list of prompts: for tests, benchmarks and scripts
that want whole answers rather than a stream."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from executor_service.engine.engine import Engine
from executor_service.engine.request_output import TokenLogprob, Usage
from pagedserve.protocol.sampling_params import SamplingParams


@dataclass(slots=True)
class Completion:
    request_id: str
    # Generated token ids of each choice (n of them).
    choices: list[list[int]] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    # Beam search and best_of: each choice's ranking score and cumulative log-probability.
    scores: list[float | None] = field(default_factory=list)
    cumulative_logprobs: list[float | None] = field(default_factory=list)
    # Each choice's tokens' logprobs, when the params ask for them.
    logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    # The prompt's tokens 1 .. P-1 scored, when the params ask for prompt logprobs.
    prompt_logprobs: list[TokenLogprob] | None = None
    usage: Usage | None = None
    error: str | None = None


def generate(engine: Engine, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams], *,
             cache_salt: str = "", max_steps: int = 1_000_000) -> list[Completion]:
    """Submits every prompt at once and steps until all are done; completions in prompt order."""
    all_params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    completions = {}
    for index, (prompt, request_params) in enumerate(zip(prompts, all_params)):
        request_id = f"offline-{id(completions)}-{index}"
        engine.add_request(request_id, prompt, request_params, cache_salt)
        n = request_params.n
        completions[request_id] = Completion(request_id, [[] for _ in range(n)], [None] * n,
                                             [None] * n, [None] * n, [[] for _ in range(n)])
    for _ in range(max_steps):
        if not engine.has_work():
            break
        for output in engine.step():
            completion = completions[output.request_id]
            if output.prompt_logprobs is not None:
                completion.prompt_logprobs = output.prompt_logprobs
            for delta in output.deltas:
                completion.choices[delta.index] += delta.token_ids
                completion.logprobs[delta.index] += delta.logprobs or []
                if delta.finish_reason is not None:
                    completion.finish_reasons[delta.index] = delta.finish_reason
                if delta.score is not None:
                    completion.scores[delta.index] = delta.score
                    completion.cumulative_logprobs[delta.index] = delta.cumulative_logprob
            if output.finished:
                completion.usage, completion.error = output.usage, output.error
    else:
        raise RuntimeError(f"the engine did not finish within {max_steps} steps")
    return list(completions.values())
