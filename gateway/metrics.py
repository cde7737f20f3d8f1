"""The gateway's own Prometheus metrics: what its clients experienced.

Every request, from gRPC or HTTP, passes through `GatewayMetrics.observe`, which watches its
event stream and records, once the stream ends however it ends:

    pagedserve_gateway_requests_total{api, outcome}
        outcome: success (every choice ended by stop or length), cancelled (the client went
        away, or the executor cancelled), error (an executor failed mid-stream), invalid (a
        field, prompt or model refused), rejected (over the admission limits), unavailable (no
        executor could take it)
    pagedserve_gateway_time_to_first_token_seconds    from arrival to the first token out
    pagedserve_gateway_time_per_output_token_seconds  after the first token, per token of the
                                                       longest choice (n > 1 decode together)
    pagedserve_gateway_prompt_tokens_total, _generation_tokens_total, _cached_prompt_tokens_total

The cluster's side (KV usage, prefix hits, preemptions, stalls) is read live at scrape time by
gateway/cluster_metrics.py.
"""
from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.admission import Admission
from gateway.generation import GenerationEvent
from pagedserve.common import errors

# Latencies of a CPU laptop and of an H200 both land inside these.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

# Refusals, most specific class first (NotFound is a bad model name: the caller's mistake).
OUTCOME_OF_ERROR = ((errors.ResourceExhausted, "rejected"), (errors.Unavailable, "unavailable"),
                    (errors.InvalidArgument, "invalid"), (errors.NotFound, "invalid"),
                    (errors.Unauthenticated, "invalid"))


def outcome_of_error(error: BaseException) -> str:
    for cls, outcome in OUTCOME_OF_ERROR:
        if isinstance(error, cls):
            return outcome
    return "error"


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("pagedserve_gateway_requests", "Requests ended, by API and "
                                "outcome", ["api", "outcome"], registry=r)
        self.ttft = Histogram("pagedserve_gateway_time_to_first_token_seconds",
                              "Arrival to first generated token", ["api"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("pagedserve_gateway_time_per_output_token_seconds",
                              "Time per generated token after the first", ["api"],
                              buckets=TPOT_BUCKETS, registry=r)
        self.prompt_tokens = Counter("pagedserve_gateway_prompt_tokens",
                                     "Prompt tokens of served requests", registry=r)
        self.generation_tokens = Counter("pagedserve_gateway_generation_tokens",
                                         "Tokens generated, over all choices", registry=r)
        self.cached_tokens = Counter("pagedserve_gateway_cached_prompt_tokens",
                                     "Prompt tokens served from the prefix cache", registry=r)

    def watch_admission(self, admission: Admission) -> None:
        Gauge("pagedserve_gateway_requests_running", "Requests admitted and generating",
              registry=self.registry).set_function(lambda: admission.running)
        Gauge("pagedserve_gateway_requests_queued", "Requests waiting for admission",
              registry=self.registry).set_function(lambda: admission.queued)

    async def observe(self, events: AsyncGenerator[GenerationEvent, None], api: str
                      ) -> AsyncIterator[GenerationEvent]:
        """Passes `events` through, recording the request once it ends. Closing this generator
        early, or cancelling its task (a client that went away), closes `events` and counts as
        cancelled."""
        started = time.monotonic()
        first_token_at: float | None = None
        tokens_per_choice: dict[int, int] = {}
        finishes: list[str] = []
        outcome = "cancelled"
        try:
            async for event in events:
                new_tokens = 0
                for delta in event.choices:
                    new_tokens += len(delta.token_ids)
                    tokens_per_choice[delta.index] = (tokens_per_choice.get(delta.index, 0)
                                                      + len(delta.token_ids))
                    if delta.finish_reason:
                        finishes.append(delta.finish_reason)
                if new_tokens and first_token_at is None:
                    first_token_at = time.monotonic()
                    self.ttft.labels(api).observe(first_token_at - started)
                if event.usage is not None:
                    self._count_usage(event)
                yield event
            outcome = ("error" if "error" in finishes
                       else "cancelled" if "cancelled" in finishes else "success")
        except Exception as error:
            outcome = outcome_of_error(error)
            raise
        finally:
            await events.aclose()
            self.requests.labels(api, outcome).inc()
            longest = max(tokens_per_choice.values(), default=0)
            if first_token_at is not None and longest > 1:
                self.tpot.labels(api).observe(
                    (time.monotonic() - first_token_at) / (longest - 1))

    def _count_usage(self, event: GenerationEvent) -> None:
        usage = event.usage
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.generation_tokens.inc(usage.completion_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
