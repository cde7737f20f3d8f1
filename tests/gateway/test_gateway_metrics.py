"""GatewayMetrics.observe: each way a request's stream can end is counted once, under the right
outcome, and the token and latency series follow the events."""
from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from gateway.choice_stream import ChoiceDelta
from gateway.generation import GenerationEvent, Usage
from gateway.metrics import GatewayMetrics
from pagedserve.common import errors


async def stream(*finishes: str | None, fail: Exception | None = None):
    """A request's events: two tokens per choice, then the given finish reasons."""
    yield GenerationEvent([ChoiceDelta(i, "ab", [1, 2]) for i in range(len(finishes))],
                          model="m", request_id="r")
    if fail is not None:
        raise fail
    yield GenerationEvent([ChoiceDelta(i, "c", [3], finish_reason=reason)
                           for i, reason in enumerate(finishes)],
                          usage=Usage(5, 3 * len(finishes), 4))


def observed(metrics: GatewayMetrics, events, api: str) -> list[GenerationEvent]:
    """Every event `observe` passes on, iterated to the end as a server would."""
    async def collect() -> list[GenerationEvent]:
        return [event async for event in metrics.observe(events, api)]
    return asyncio.run(collect())


def count(metrics: GatewayMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("finishes, outcome", [
    (("stop",), "success"), (("length", "stop"), "success"),
    (("stop", "cancelled"), "cancelled"), (("error", "stop"), "error"),
])
def test_a_stream_that_ends_is_counted_by_its_finish_reasons(finishes, outcome):
    metrics = GatewayMetrics()
    assert len(observed(metrics, stream(*finishes), "grpc")) == 2
    assert count(metrics, "pagedserve_gateway_requests_total", api="grpc",
                 outcome=outcome) == 1
    assert count(metrics, "pagedserve_gateway_prompt_tokens_total") == 5
    assert count(metrics, "pagedserve_gateway_generation_tokens_total") == 3 * len(finishes)
    assert count(metrics, "pagedserve_gateway_cached_prompt_tokens_total") == 4
    assert count(metrics, "pagedserve_gateway_time_to_first_token_seconds_count",
                 api="grpc") == 1
    assert count(metrics, "pagedserve_gateway_time_per_output_token_seconds_count",
                 api="grpc") == 1


@pytest.mark.parametrize("error, outcome", [
    (errors.InvalidArgument("top_p"), "invalid"), (errors.NotFound("model"), "invalid"),
    (errors.ResourceExhausted("full"), "rejected"), (errors.Unavailable("none"), "unavailable"),
    (RuntimeError("bug"), "error"),
])
def test_a_stream_that_raises_is_counted_by_the_error(error, outcome):
    metrics = GatewayMetrics()
    with pytest.raises(type(error)):
        observed(metrics, stream("stop", fail=error), "http")
    assert count(metrics, "pagedserve_gateway_requests_total", api="http",
                 outcome=outcome) == 1


def test_a_client_that_stops_reading_is_cancelled_and_its_stream_closed():
    metrics = GatewayMetrics()
    events = stream("stop")

    async def read_one_then_leave() -> None:
        passed_on = metrics.observe(events, "http")
        await anext(passed_on)
        await passed_on.aclose()

    asyncio.run(read_one_then_leave())
    assert events.ag_frame is None, "the generation itself was closed"
    assert count(metrics, "pagedserve_gateway_requests_total", api="http",
                 outcome="cancelled") == 1
    assert count(metrics, "pagedserve_gateway_prompt_tokens_total") == 0
    assert b"pagedserve_gateway_requests_total" in generate_latest(metrics.registry)
