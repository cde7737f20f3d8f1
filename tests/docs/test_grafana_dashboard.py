"""docs/grafana/pagedserve-dashboard.json queries only series the gateway's /metrics serves: each
metric name in each panel's PromQL (and in the model variable's query) must be the sample name
of a family the gateway registers, with the suffix its type gives it. Renaming a metric, or
asking a counter for `_bucket`, fails here instead of leaving a panel empty."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.admission import Admission
from gateway.cluster_metrics import declared_families
from gateway.metrics import GatewayMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "pagedserve-dashboard.json"

# The sample names a family of each type is scraped under (`_created` is never charted).
SAMPLE_SUFFIXES = {"counter": ("_total",), "gauge": ("",),
                   "histogram": ("_bucket", "_sum", "_count")}
# Words PromQL reserves, which an identifier scan would otherwise take for metric names.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "atan2"}


def exported_sample_names() -> set[str]:
    """Every sample name the gateway's /metrics can carry: its own registry, as the gateway
    builds it, and the cluster collector's families, which a scrape shows only while the
    services answer."""
    metrics = GatewayMetrics()
    metrics.watch_admission(Admission(max_running=1, max_queued=1))
    families = [*metrics.registry.collect(), *declared_families()]
    return {family.name + suffix for family in families
            for suffix in SAMPLE_SUFFIXES[family.type]}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers once strings, label matchers,
    range selectors, grouping label lists and Grafana variables are removed, that are not
    function calls or keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", expr):
        called = expr[match.end():].lstrip().startswith("(")
        if not called and match.group() not in KEYWORDS:
            names.add(match.group())
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, rows' panels included, and every variable."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        queries += [(f"panel {panel['title']!r}", target["expr"])
                    for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(METRIC, LABEL): the label is no metric.
            query = variable["query"]["query"]
            queries.append((f"variable {variable['name']}",
                            re.sub(r"label_values\((.*),\s*\w+\)", r"\1", query)))
    return queries


@pytest.mark.parametrize("expr, names", [
    ('histogram_quantile(0.99, sum by (le, model_name) (rate(a_seconds_bucket{x="y"}[5m])))',
     {"a_seconds_bucket"}),
    ("sum(rate(hits_total[$__rate_interval])) / sum(rate(queries_total[1m] offset 1h)) > 1e3",
     {"hits_total", "queries_total"}),
    ("sum(rate(x_total[5m])) by (executor) and on (executor) up_gauge", {"x_total", "up_gauge"}),
    ('count_values("value", build_info{job=~"$job|${other}"})', {"build_info"}),
])
def test_metric_names_finds_only_the_selected_series(expr, names):
    assert metric_names(expr) == names


def test_every_dashboard_query_names_a_series_the_gateway_exports():
    exported = exported_sample_names()
    queries = dashboard_queries()
    assert len(queries) > 20
    unknown = {(where, name) for where, expr in queries for name in metric_names(expr)
               if name not in exported}
    assert not unknown, f"not exported: {sorted(unknown)}; exported: {sorted(exported)}"


def test_every_panel_reads_the_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert any(variable["name"] == "DS_PROMETHEUS" and variable["type"] == "datasource"
               for variable in dashboard["templating"]["list"])
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])
