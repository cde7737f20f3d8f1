"""The gateway's own Prometheus metrics: what its clients experienced.

Every request, from gRPC or HTTP, passes through `GatewayMetrics.observe`, which watches its
event stream and records, once the stream ends however it ends; an HTTP request refused before
it became one (bad JSON, an unknown or refused field, a wrong type) is counted by
`count_refusal`. Each series is labelled {api, ..., model_name}; a name is vLLM's with
`pagedserve_gateway_` for `vllm:` wherever vLLM has the series (docs/gateway.md#metrics):

    pagedserve_gateway_requests_total{api, outcome, model_name}
        outcome: success (every choice ended by stop or length), cancelled (the client went
        away, or the executor cancelled), error (an executor failed mid-stream), invalid (a
        field, prompt or model refused), rejected (over the admission limits), unavailable (no
        executor could take it)
    pagedserve_gateway_request_success_total{api, finished_reason, model_name}
        per choice: stop, length, cancelled, error (a choice cut off without one: cancelled)
    pagedserve_gateway_time_to_first_token_seconds    arrival to the first token out
    pagedserve_gateway_time_per_output_token_seconds  after the first token, per token of the
                                                       longest choice (n > 1 decode together)
    pagedserve_gateway_e2e_request_latency_seconds    arrival to the stream's end
    pagedserve_gateway_request_queue_time_seconds     arrival to submission to an executor
    pagedserve_gateway_request_prompt_tokens, _request_generation_tokens   per request
    pagedserve_gateway_prompt_tokens_total, _generation_tokens_total, _cached_prompt_tokens_total

model_name is the name of a model served here, or "unknown": never a client's own string, so
that a client cannot grow the label set without bound.

The cluster's side (KV usage, prefix hits, preemptions, stalls) is read live at scrape time by
gateway/cluster_metrics.py.
"""
from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.admission import Admission
from gateway.generation import GenerationEvent, Usage
from pagedserve.common import errors

# Latencies of a CPU laptop and of an H200 both land inside these.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# Queue time is tokenizing and routing (milliseconds) unless admission makes a request wait.
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
# 1-2-5 steps up to the longest context windows served.
TOKEN_BUCKETS = tuple(step * 10 ** power for power in range(6) for step in (1, 2, 5))

# A request whose model is not (or not yet) known to be one served here.
UNKNOWN_MODEL = "unknown"

# Refusals, most specific class first (NotFound is a bad model name: the caller's mistake).
OUTCOME_OF_ERROR = ((errors.ResourceExhausted, "rejected"), (errors.Unavailable, "unavailable"),
                    (errors.InvalidArgument, "invalid"), (errors.NotFound, "invalid"),
                    (errors.Unauthenticated, "invalid"))


def outcome_of_error(error: BaseException) -> str:
    for cls, outcome in OUTCOME_OF_ERROR:
        if isinstance(error, cls):
            return outcome
    return "error"


@dataclass(slots=True)
class _RequestSeen:
    """What one request's events showed so far."""
    model_name: str
    started: float
    first_token_at: float | None = None
    answered: bool = False                      # an executor sent at least one event
    tokens_per_choice: dict[int, int] = field(default_factory=dict)
    finish_per_choice: dict[int, str] = field(default_factory=dict)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        labels = ["api", "model_name"]
        self.requests = Counter("pagedserve_gateway_requests", "Requests ended, by API and "
                                "outcome", ["api", "outcome", "model_name"], registry=r)
        self.finished_choices = Counter(
            "pagedserve_gateway_request_success", "Choices ended, by finish reason (vLLM's "
            "request_success: cancelled and failed choices too)",
            ["api", "finished_reason", "model_name"], registry=r)
        self.ttft = Histogram("pagedserve_gateway_time_to_first_token_seconds",
                              "Arrival to first generated token", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("pagedserve_gateway_time_per_output_token_seconds",
                              "Time per generated token after the first", labels,
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("pagedserve_gateway_e2e_request_latency_seconds",
                             "Arrival to the last event, of requests an executor answered",
                             labels, buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram("pagedserve_gateway_request_queue_time_seconds",
                                    "Arrival to submission to an executor (tokenizing, "
                                    "admission, routing)", labels, buckets=QUEUE_BUCKETS,
                                    registry=r)
        self.request_prompt_tokens = Histogram(
            "pagedserve_gateway_request_prompt_tokens", "Prompt tokens per request", labels,
            buckets=TOKEN_BUCKETS, registry=r)
        self.request_generation_tokens = Histogram(
            "pagedserve_gateway_request_generation_tokens", "Tokens generated per request, "
            "over all its choices", labels, buckets=TOKEN_BUCKETS, registry=r)
        self.prompt_tokens = Counter("pagedserve_gateway_prompt_tokens",
                                     "Prompt tokens of served requests", labels, registry=r)
        self.generation_tokens = Counter("pagedserve_gateway_generation_tokens",
                                         "Tokens generated, over all choices", labels,
                                         registry=r)
        self.cached_tokens = Counter("pagedserve_gateway_cached_prompt_tokens",
                                     "Prompt tokens served from the prefix cache", labels,
                                     registry=r)
        self._served_models: Callable[[], Collection[str]] = tuple

    def watch_admission(self, admission: Admission) -> None:
        Gauge("pagedserve_gateway_requests_running", "Requests admitted and generating",
              registry=self.registry).set_function(lambda: admission.running)
        Gauge("pagedserve_gateway_requests_queued", "Requests waiting for admission",
              registry=self.registry).set_function(lambda: admission.queued)

    def watch_models(self, served_models: Callable[[], Collection[str]]) -> None:
        """`served_models()`: the names of the models served now, which `model_label` picks
        from."""
        self._served_models = served_models

    def model_label(self, requested: object) -> str:
        """The model_name label of a request that asked for `requested` (the body's value;
        None or "" when it named none): a served model's name, or "unknown"."""
        served = self._served_models()
        if isinstance(requested, str) and requested in served:
            return requested
        if requested in (None, "") and len(served) == 1:
            return next(iter(served))      # the model a request naming none is served by
        return UNKNOWN_MODEL

    def count_refusal(self, api: str, error: BaseException, requested_model: object) -> None:
        """A request refused before it could be observed (its body did not parse)."""
        self.requests.labels(api, outcome_of_error(error), self.model_label(requested_model)
                             ).inc()

    async def observe(self, events: AsyncGenerator[GenerationEvent, None], api: str,
                      requested_model: str = "") -> AsyncIterator[GenerationEvent]:
        """Passes `events` through, recording the request once it ends. Closing this generator
        early, or cancelling its task (a client that went away), closes `events` and counts as
        cancelled. Until the first event names the model serving it, the request is labelled
        with `requested_model`'s label."""
        seen = _RequestSeen(self.model_label(requested_model), time.monotonic())
        outcome = "cancelled"
        try:
            async for event in events:
                self._see(seen, api, event)
                yield event
            finishes = seen.finish_per_choice.values()
            outcome = ("error" if "error" in finishes
                       else "cancelled" if "cancelled" in finishes else "success")
        except Exception as error:
            outcome = outcome_of_error(error)
            raise
        finally:
            await events.aclose()
            self._record_end(seen, api, outcome)

    def _see(self, seen: _RequestSeen, api: str, event: GenerationEvent) -> None:
        if event.model:
            seen.model_name = event.model
        seen.answered = True
        labels = (api, seen.model_name)
        if event.submitted_at is not None:
            self.queue_time.labels(*labels).observe(event.submitted_at - seen.started)
        new_tokens = 0
        for delta in event.choices:
            new_tokens += len(delta.token_ids)
            seen.tokens_per_choice[delta.index] = (seen.tokens_per_choice.get(delta.index, 0)
                                                   + len(delta.token_ids))
            if delta.finish_reason:
                seen.finish_per_choice[delta.index] = delta.finish_reason
        if new_tokens and seen.first_token_at is None:
            seen.first_token_at = time.monotonic()
            self.ttft.labels(*labels).observe(seen.first_token_at - seen.started)
        if event.usage is not None:
            self._count_usage(labels, event.usage)

    def _record_end(self, seen: _RequestSeen, api: str, outcome: str) -> None:
        now = time.monotonic()
        labels = (api, seen.model_name)
        self.requests.labels(api, outcome, seen.model_name).inc()
        # A choice the stream stopped short of finishing (its client went away) was cancelled.
        for index in seen.tokens_per_choice.keys() | seen.finish_per_choice.keys():
            reason = seen.finish_per_choice.get(index, "cancelled")
            self.finished_choices.labels(api, reason, seen.model_name).inc()
        if seen.answered:
            self.e2e.labels(*labels).observe(now - seen.started)
        longest = max(seen.tokens_per_choice.values(), default=0)
        if seen.first_token_at is not None and longest > 1:
            self.tpot.labels(*labels).observe((now - seen.first_token_at) / (longest - 1))

    def _count_usage(self, labels: tuple[str, str], usage: Usage) -> None:
        self.prompt_tokens.labels(*labels).inc(usage.prompt_tokens)
        self.generation_tokens.labels(*labels).inc(usage.completion_tokens)
        self.cached_tokens.labels(*labels).inc(usage.cached_tokens)
        self.request_prompt_tokens.labels(*labels).observe(usage.prompt_tokens)
        self.request_generation_tokens.labels(*labels).observe(usage.completion_tokens)
