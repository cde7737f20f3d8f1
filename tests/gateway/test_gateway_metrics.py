"""GatewayMetrics: each way a request's stream can end is counted once, under the right outcome,
finish reasons and model; the token and latency series follow the events. Then a live gateway:
a completion and a refused body show up in its /metrics under the served model's name."""
from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.choice_stream import ChoiceDelta
from gateway.cluster_metrics import declared_families
from gateway.generation import GenerationEvent, Usage
from gateway.metrics import GatewayMetrics
from pagedserve.common import errors

MODEL = "pagedserve-embedded-llama"


async def stream(*finishes: str | None, fail: Exception | None = None):
    """A request's events: two tokens per choice, then the given finish reasons."""
    yield GenerationEvent([ChoiceDelta(i, "ab", [1, 2]) for i in range(len(finishes))],
                          model="m", request_id="r", submitted_at=time.monotonic())
    if fail is not None:
        raise fail
    yield GenerationEvent([ChoiceDelta(i, "c", [3], finish_reason=reason)
                           for i, reason in enumerate(finishes)],
                          usage=Usage(5, 3 * len(finishes), 4))


async def refused(error: Exception):
    """A request refused before its first event (a bad field, an unknown model)."""
    raise error
    yield GenerationEvent()   # pragma: no cover - makes this an async generator


def observed(metrics: GatewayMetrics, events, api: str, model: str = ""
             ) -> list[GenerationEvent]:
    """Every event `observe` passes on, iterated to the end as a server would."""
    async def collect() -> list[GenerationEvent]:
        return [event async for event in metrics.observe(events, api, model)]
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
    model = dict(api="grpc", model_name="m")
    assert count(metrics, "pagedserve_gateway_requests_total", outcome=outcome, **model) == 1
    for reason in set(finishes):
        assert count(metrics, "pagedserve_gateway_request_success_total",
                     finished_reason=reason, **model) == finishes.count(reason)
    assert count(metrics, "pagedserve_gateway_prompt_tokens_total", **model) == 5
    assert count(metrics, "pagedserve_gateway_generation_tokens_total",
                 **model) == 3 * len(finishes)
    assert count(metrics, "pagedserve_gateway_cached_prompt_tokens_total", **model) == 4
    assert count(metrics, "pagedserve_gateway_request_prompt_tokens_sum", **model) == 5
    assert count(metrics, "pagedserve_gateway_request_generation_tokens_sum",
                 **model) == 3 * len(finishes)
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds",
                      "e2e_request_latency_seconds", "request_queue_time_seconds",
                      "request_prompt_tokens", "request_generation_tokens"):
        assert count(metrics, f"pagedserve_gateway_{histogram}_count", **model) == 1, histogram


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
                 outcome=outcome, model_name="m") == 1
    assert count(metrics, "pagedserve_gateway_request_success_total", api="http",
                 finished_reason="cancelled", model_name="m") == 1, "cut off: cancelled"


def test_a_client_that_stops_reading_is_cancelled_and_its_stream_closed():
    metrics = GatewayMetrics()
    events = stream("stop", "stop")

    async def read_one_then_leave() -> None:
        passed_on = metrics.observe(events, "http")
        await anext(passed_on)
        await passed_on.aclose()

    asyncio.run(read_one_then_leave())
    assert events.ag_frame is None, "the generation itself was closed"
    model = dict(api="http", model_name="m")
    assert count(metrics, "pagedserve_gateway_requests_total", outcome="cancelled",
                 **model) == 1
    assert count(metrics, "pagedserve_gateway_request_success_total",
                 finished_reason="cancelled", **model) == 2, "both begun choices"
    assert count(metrics, "pagedserve_gateway_prompt_tokens_total", **model) == 0
    assert count(metrics, "pagedserve_gateway_e2e_request_latency_seconds_count", **model) == 1
    assert b"pagedserve_gateway_requests_total" in generate_latest(metrics.registry)


@pytest.mark.parametrize("requested, label", [
    ("served-a", "served-a"), ("", "unknown"), (None, "unknown"), ("client-made", "unknown"),
    (["served-a"], "unknown"),
])
def test_the_model_label_is_a_served_name_or_unknown(requested, label):
    metrics = GatewayMetrics()
    metrics.watch_models(lambda: {"served-a": 1, "served-b": 2})
    assert metrics.model_label(requested) == label


@pytest.mark.parametrize("requested", ["", None])
def test_a_request_naming_no_model_is_labelled_with_the_only_one_served(requested):
    metrics = GatewayMetrics()
    metrics.watch_models(lambda: ("only",))
    assert metrics.model_label(requested) == "only"


def test_a_request_refused_before_its_first_event_is_labelled_as_it_asked():
    metrics = GatewayMetrics()
    metrics.watch_models(lambda: ("served-a", "served-b"))
    for requested in ("served-b", "made-up"):
        with pytest.raises(errors.InvalidArgument):
            observed(metrics, refused(errors.InvalidArgument("bad")), "grpc", requested)
    for label in ("served-b", "unknown"):
        model = dict(api="grpc", model_name=label)
        assert count(metrics, "pagedserve_gateway_requests_total", outcome="invalid",
                     **model) == 1
        assert count(metrics, "pagedserve_gateway_e2e_request_latency_seconds_count",
                     **model) == 0, "never answered: no latency"
    assert b"made-up" not in generate_latest(metrics.registry)


# -- a live gateway ------------------------------------------------------------------------------

def scrape(http_url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the gateway's /metrics, by name and labels."""
    text = httpx.get(f"{http_url}/metrics", timeout=30).text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_a_completion_shows_its_finish_reason_and_histograms_under_its_model(stack):
    _, gateway = stack
    before = scrape(gateway.http_url)
    response = httpx.post(f"{gateway.http_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "Hello, metrics", "max_tokens": 4, "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] == "length"
    usage = response.json()["usage"]
    after = scrape(gateway.http_url)

    def grew(name: str, **labels) -> float:
        labels = dict(api="http", model_name=MODEL, **labels)
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("pagedserve_gateway_requests_total", outcome="success") == 1
    assert grew("pagedserve_gateway_request_success_total", finished_reason="length") == 1
    assert grew("pagedserve_gateway_request_prompt_tokens_sum") == usage["prompt_tokens"]
    assert grew("pagedserve_gateway_request_generation_tokens_sum") == 4
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds",
                      "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert grew(f"pagedserve_gateway_{histogram}_count") == 1, histogram
    assert 0 < grew("pagedserve_gateway_request_queue_time_seconds_sum") < grew(
        "pagedserve_gateway_e2e_request_latency_seconds_sum")


@pytest.mark.parametrize("body, label", [
    ({"model": MODEL, "prompt": "hi", "not_a_field": 1}, MODEL),
    ({"prompt": "hi", "max_tokens": "many"}, MODEL),          # no model: the only one served
    (f'{{"model": "{MODEL}", "prompt": ', MODEL),              # not JSON: no model to read
    ({"model": f"made-up-{uuid.uuid4().hex}", "prompt": "hi", "suffix": "end"}, "unknown"),
])
def test_a_body_refused_at_the_field_layer_is_counted_invalid(stack, body, label):
    _, gateway = stack
    labels = dict(api="http", outcome="invalid", model_name=label)
    before = value(scrape(gateway.http_url), "pagedserve_gateway_requests_total", **labels)
    sent = dict(content=body) if isinstance(body, str) else dict(json=body)
    response = httpx.post(f"{gateway.http_url}/v1/completions", timeout=30, **sent)
    assert response.status_code == 400, response.text
    text = httpx.get(f"{gateway.http_url}/metrics", timeout=30).text
    assert "made-up-" not in text, "a client's model name never becomes a label"
    after = value(scrape(gateway.http_url), "pagedserve_gateway_requests_total", **labels)
    assert after - before == 1


def test_a_scrape_declares_every_cluster_family_the_collector_declares(stack):
    _, gateway = stack
    text = httpx.get(f"{gateway.http_url}/metrics", timeout=30).text
    scraped = {family.name for family in text_string_to_metric_families(text)}
    assert {family.name for family in declared_families()} <= scraped
