"""The Grafana dashboard: its PromQL parses, and every kvcast metric it or the rules use exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kvcast.exporters.metrics import METRICS
from tests.deploy.tools import DASHBOARD, RULES, need, run

# The series each kind of metric exposes (prometheus_client's naming).
SUFFIXES = {
    "gauge": ("",),
    "counter": ("_total",),
    "info": ("_info",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
# Grafana's variables, replaced by something of the same syntactic kind before parsing.
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[tuple[str, str]]:
    """(panel_<id>_<refId>, expr) of every panel target."""
    return [
        (f"panel_{panel['id']}_{target['refId']}", target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def template_queries() -> list[str]:
    return [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def expand(expr: str) -> str:
    """Grafana's $var / ${var} replaced: intervals by durations, the rest by a name."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: GRAFANA_VARIABLES.get(m.group(1), m.group(1)), expr)


def exposed_series() -> set[str]:
    return {
        name + suffix
        for name, (kind, _help, _labels) in METRICS.items()
        for suffix in SUFFIXES[kind]
    }


@pytest.mark.integration
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses each expression, written as a recording rule named after its panel."""
    queries = panel_queries()
    rules = [{"record": f"dashboard:{where}", "expr": expand(q)} for where, q in queries]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run([need("promtool"), "check", "rules", str(path)])
    assert f"SUCCESS: {len(queries)} rules found" in out


def test_every_kvcast_metric_used_is_declared() -> None:
    exprs = [q for _, q in panel_queries()] + template_queries() + rule_exprs()
    used = {name for expr in exprs for name in re.findall(r"\bkvcast_\w+", expr)}
    assert used, "no kvcast metric found: the extraction is broken"
    unknown = used - exposed_series()
    assert not unknown, f"not declared in exporters/metrics.py METRICS: {sorted(unknown)}"


def test_the_dashboard_shows_what_spec_8_asks_for() -> None:
    text = " ".join(q for _, q in panel_queries())
    for series in (
        "kvcast_hit_ratio_forecast",
        "kvcast_hit_ratio_observed",
        "rate(vllm:prefix_cache_hits_total",
        "rate(vllm:prefix_cache_queries_total",
        "kvcast_hit_ratio_upper_bound",
        "kvcast_characteristic_time_seconds",
        "kvcast_conversation_arrival_rate",
        "kvcast_required_capacity_blocks",
        "kvcast_classifier_latency_seconds_bucket",
        "kvcast_consumer_lag_events",
        "kvcast_events_rejected_total",
        "kvcast_forecast_error",  # SPEC section 12: the shadow simulation beside the forecast
    ):
        assert series in text, series
    heatmaps = [p for p in dashboard()["panels"] if p["type"] == "heatmap"]
    for metric in ("kvcast_continuation_probability", "kvcast_reuse_median_seconds"):
        assert any(
            metric in t["expr"] and "by (intent, turn)" in t["expr"]
            for p in heatmaps
            for t in p["targets"]
        ), metric


def test_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_a_panel_sets_each_tiers_forecast_beside_what_the_engines_report_of_it() -> None:
    """Issue 34: per cache tier, the tiered forecast and the engines' observed share, by tier on
    one panel (the same labels the per-tier divergence alert joins on)."""
    tiered = [
        panel
        for panel in dashboard()["panels"]
        if any("kvcast_hit_ratio_forecast_tier" in t["expr"] for t in panel["targets"])
    ]
    assert len(tiered) == 1, "one panel with the per-tier forecast"
    (panel,) = tiered
    by_legend = {t["legendFormat"]: " ".join(t["expr"].split()) for t in panel["targets"]}
    assert "by (tier) (kvcast_hit_ratio_forecast_tier{" in by_legend["forecast {{tier}}"]
    assert "by (tier) (kvcast_engine_hit_ratio_tier{" in by_legend["observed {{tier}}"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    # The engines' own counters, for a Prometheus that scrapes them directly.
    text = " ".join(by_legend.values())
    assert "rate(sglang:cached_tokens_total{" in text
    assert "rate(vllm:prompt_tokens_cached_by_source_total{" in text


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
