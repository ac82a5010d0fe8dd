"""The alerting rules: promtool checks and unit tests, and what every rule must carry."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.deploy.tools import DEPLOY, ROOT, RULES, need, run

RULE_TESTS = DEPLOY / "prometheus" / "kvcast-rules.test.yaml"
SEVERITIES = {"critical", "warning", "info"}


def alerting_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


@pytest.mark.integration
def test_promtool_accepts_the_rules() -> None:
    out = run([need("promtool"), "check", "rules", str(RULES)])
    assert f"SUCCESS: {len(alerting_rules())} rules found" in out


@pytest.mark.integration
def test_promtool_unit_tests_pass() -> None:
    out = run([need("promtool"), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent)
    assert "SUCCESS" in out


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for rule in alerting_rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']}: no firing case"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']}: no quiet case"


def test_every_alert_has_severity_annotations_and_an_existing_runbook() -> None:
    rules = alerting_rules()
    assert len(rules) >= 6
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        runbook = rule["annotations"]["runbook_url"]
        assert runbook == f"docs/runbooks/{name}.md", name
        assert (ROOT / runbook).is_file(), f"{name}: {runbook} does not exist"
        assert re.search(r"^# " + name + "$", (ROOT / runbook).read_text(), re.M), runbook


def test_the_spec_alerts_are_all_there() -> None:
    """SPEC section 8: below a threshold, dropped against its own level, stale, observed far below
    the forecast, consumer lag growing, events rejected."""
    exprs = {rule["alert"]: " ".join(rule["expr"].split()) for rule in alerting_rules()}
    assert "kvcast_hit_ratio_forecast) <" in exprs["KvcastPredictedHitRatioLow"]
    assert "offset" in exprs["KvcastPredictedHitRatioDropped"]
    assert "kvcast_forecast_age_seconds" in exprs["KvcastForecastStale"]
    assert "kvcast_hit_ratio_observed" in exprs["KvcastObservedFarBelowForecast"]
    assert "deriv(kvcast_consumer_lag_events" in exprs["KvcastConsumerLagGrowing"]
    assert "rate(kvcast_events_rejected_total" in exprs["KvcastEventsRejected"]


def test_the_prometheus_rule_manifest_carries_the_same_groups() -> None:
    manifest = yaml.safe_load((DEPLOY / "k8s" / "base" / "prometheusrule.yaml").read_text())
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], (
        "k8s/base/prometheusrule.yaml differs from prometheus/kvcast-rules.yaml: copy the "
        "groups over (indented under spec)"
    )


def test_every_runbook_belongs_to_an_alert() -> None:
    names = {rule["alert"] for rule in alerting_rules()}
    pages = {p.stem for p in (ROOT / "docs" / "runbooks").glob("*.md")} - {"README"}
    assert pages == names
