"""/metrics scraped over HTTP from a daemon: SPEC names, types, units, and the values it serves.

The daemon runs in-process on a replay source with the in-memory store; the scrape goes through
the real HTTP server and is parsed with Prometheus's own text parser.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvcast.daemon.publisher import Publisher
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import ReplaySource
from kvcast.daemon.stores.instrumented import InstrumentedStore
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.exporters.http_server import HttpServer
from kvcast.exporters.metrics import METRICS, KvcastCollector, build_registry
from kvcast.exporters.view import MetricsView
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.documents import (
    ForecastDocument,
    ShadowCurve,
    TableDefaults,
    TableDocument,
    TableState,
)
from kvcast.stats.forecast import RequiredCapacity
from kvcast.stats.tiers import TierForecast
from tests.support import forecast_doc

# SPEC section 6: these names (and their types) are a contract.
SPEC_METRICS = {
    "kvcast_hit_ratio_forecast": "gauge",
    "kvcast_hit_ratio_upper_bound": "gauge",
    "kvcast_hit_ratio_observed": "gauge",
    "kvcast_characteristic_time_seconds": "gauge",
    "kvcast_conversation_arrival_rate": "gauge",
    "kvcast_capacity_blocks": "gauge",
    "kvcast_required_capacity_blocks": "gauge",
    "kvcast_continuation_probability": "gauge",
    "kvcast_reuse_median_seconds": "gauge",
    "kvcast_events": "counter",
    "kvcast_events_rejected": "counter",
    "kvcast_table_version": "gauge",
    "kvcast_forecast_age_seconds": "gauge",
    "kvcast_consumer_lag_events": "gauge",
}


def workload() -> Any:
    return generate(
        preset("mixed"), lambda0=1.0, conversations=600, seed=8, cached_capacity_blocks=3000
    )


@pytest.fixture(scope="module")
def scraped() -> tuple[dict, Publisher]:
    trace = workload()
    lines = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    lines.insert(10, b'{"turn": 1}')
    settings = DaemonSettings(
        stats=StatsConfig(completion_timeout_s=900),
        commit_interval_s=0.01, refresh_interval_s=0.05, table_interval_s=0.01,
        status_interval_s=0.05, capacity_blocks=3000, target_hit_ratios=(0.5,),
    )  # fmt: skip
    store, source = InstrumentedStore(MemoryStore()), ReplaySource(lines, partition="p:0")
    publisher = Publisher(settings, store, source.health, extra_metrics=[store.metrics])
    server = HttpServer(
        "127.0.0.1", 0, publisher.published, build_registry(publisher.published.metrics_view)
    )
    server.start()
    daemon = Daemon(settings, store, source, publisher)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    deadline = time.monotonic() + 30
    while not (daemon._flushed and not daemon._uncommitted()) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # a status round (lag) and a refresh after the last commit
    daemon.request_stop()
    thread.join(timeout=10)
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    server.close()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    return families, publisher


def value(families: dict, name: str, labels: dict | None = None) -> float:
    """The one sample called ``name`` (counters: ``..._total``, in the family without it)."""
    family = families[re.sub(r"_(total|count|sum|bucket)$", "", name)]
    samples = [
        s for s in family.samples if s.name == name and (labels is None or s.labels == labels)
    ]
    assert len(samples) == 1, (name, labels, family.samples[:3])
    return samples[0].value


def test_every_spec_metric_is_exported_with_its_type(scraped) -> None:
    families, _ = scraped
    for name, kind in SPEC_METRICS.items():
        assert name in families, name
        assert families[name].type == kind, name
    for name, (kind, help_text, _) in METRICS.items():
        exposed = f"{name}_info" if kind == "info" else name  # text format names info as gauge
        assert families[exposed].documentation == help_text, name
    for name, (_, help_text, _) in METRICS.items():
        unit = re.search(r"\(([^()]*)\)\.$", help_text)
        assert unit, f"{name}: help must end with its unit in brackets: {help_text!r}"
        if name.endswith("_seconds"):
            assert unit.group(1) == "seconds", name
        if name.endswith("_blocks"):
            assert unit.group(1) == "blocks", name


def test_values_equal_the_published_forecast_and_table(scraped) -> None:
    families, publisher = scraped
    forecast = publisher.published.forecast_document()
    table = publisher.published.table_document()
    assert value(families, "kvcast_hit_ratio_forecast") == pytest.approx(forecast["hit_ratio"])
    assert value(families, "kvcast_hit_ratio_upper_bound") == pytest.approx(forecast["upper_bound"])
    assert value(families, "kvcast_hit_ratio_observed") == pytest.approx(
        forecast["observed_hit_ratio"]
    )
    assert value(families, "kvcast_characteristic_time_seconds") == pytest.approx(
        forecast["characteristic_time_s"]
    )
    assert value(families, "kvcast_conversation_arrival_rate") == pytest.approx(forecast["lambda0"])
    assert value(families, "kvcast_capacity_blocks") == 3000
    # The newest event time the statistics have seen: the events' own clock, not the wall's.
    newest = max(event["timestamp"] for event in workload().events())
    assert value(families, "kvcast_event_time_seconds") == forecast["event_time"] == newest
    required = forecast["required_capacity_by_target"][0]
    assert (
        value(families, "kvcast_required_capacity_blocks", {"target": "0.5"})
        == (required["blocks"])
    )
    assert value(families, "kvcast_table_version") == table["version"]
    for state in table["states"]:
        labels = {"intent": state["intent"], "turn": str(state["turn"])}
        assert value(families, "kvcast_continuation_probability", labels) == pytest.approx(
            state["p_continue"]
        )
        assert value(families, "kvcast_reuse_median_seconds", labels) == pytest.approx(
            state["median_reuse_s"]
        )
    assert value(families, "kvcast_consumer_lag_events") == 0
    assert 0 <= value(families, "kvcast_forecast_age_seconds") < 60


def test_event_counters_count_every_event_once(scraped) -> None:
    families, publisher = scraped
    counters = publisher.published.metrics_view().counters
    assert value(families, "kvcast_events_total") == counters["processed"] > 0
    assert value(families, "kvcast_events_rejected_total", {"reason": "missing_field"}) == 1


def test_label_cardinality_is_bounded_by_the_table(scraped) -> None:
    families, publisher = scraped
    states = len(publisher.published.table_document()["states"])
    probability = [
        s for s in families["kvcast_continuation_probability"].samples if s.name.endswith("ty")
    ]
    assert len(probability) == states <= 64 * 32


def test_store_latency_is_a_histogram_per_operation(scraped) -> None:
    families, publisher = scraped
    family = families["kvcast_store_operation_seconds"]
    assert family.type == "histogram"
    commits = value(families, "kvcast_store_operation_seconds_count", {"operation": "commit"})
    assert commits == publisher.published.metrics_view().commits > 0
    infinite = {"operation": "commit", "le": "+Inf"}
    assert value(families, "kvcast_store_operation_seconds_bucket", infinite) == commits


def test_the_process_exports_its_own_resources_for_an_sre(scraped) -> None:
    families, _ = scraped
    resident = value(families, "process_resident_memory_bytes")
    assert 10 * 2**20 < resident < 64 * 2**30  # this test process: tens of MiB at least
    assert value(families, "process_cpu_seconds_total") > 0
    assert value(families, "process_open_fds") > 0
    assert abs(value(families, "process_start_time_seconds") - _start_time(os.getpid())) < 5


def _start_time(pid: int) -> float:
    """When ``pid`` started (Unix seconds), read from /proc independently of prometheus_client."""
    with open(f"/proc/{pid}/stat") as handle:
        started_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as handle:
        boot = next(int(line.split()[1]) for line in handle if line.startswith("btime"))
    return boot + started_ticks / os.sysconf("SC_CLK_TCK")


# -- the collector on typed documents ----------------------------------------------------------


def _histogram() -> dict[str, Any]:
    return {"buckets": [(0.01, 3), (float("inf"), 4)], "sum": 0.5, "count": 4}


def populated_view() -> MetricsView:
    """A view with every document field and every component figure set: what a primary with
    tiers, targets, the shadow simulation, a classifier and --engine-metrics publishes."""
    model = forecast_doc(
        hit_ratio=0.42, hit_ratio_single_class=0.4, upper_bound=0.7, observed_hit_ratio=0.39,
        characteristic_time_s=310.0, lambda0=2.5, capacity_blocks=3_000.0,
        tiers=(TierForecast("gpu", 3_000.0, 0.3), TierForecast("host", 9_000.0, 0.12)),
    ).forecast  # fmt: skip
    shadow = ShadowCurve.from_dict(
        {"hit_ratio": 0.4, "capacity_blocks": 3_000.0,
         "curve": [{"capacity_blocks": 3_000.0, "hit_ratio": 0.4}], "sampling_ratio": 0.05,
         "session_share": 1.0, "kept_accesses": 800, "window_start": 0.0, "events": 1_000,
         "cached_blocks": 40, "effectively_once": False}
    )  # fmt: skip
    forecast = ForecastDocument(
        model,
        (
            RequiredCapacity(0.5, 4_100, None, "ok"),
            RequiredCapacity(0.9, None, None, "unreachable"),
        ),
        event_time=5_000.0,
        window_conversations=600,
        computed_at=time.time() - 2.0,
    ).with_shadow(shadow)
    table = TableDocument(
        version=3, generated_at=5_000.0, window_conversations=600, max_turn=32,
        defaults=TableDefaults(0.5, 60.0), characteristic_time_s=310.0,
        states=(TableState("coding", 1, 0.8, 40.0, 3.7, 0.9, 120, 96),), shared=None,
    )  # fmt: skip
    return MetricsView(
        forecast=forecast,
        table=table,
        counters={
            "processed": 10,
            "duplicates": 1,
            "rejected": 2,
            "rejected_by_reason": {"too_late": 2},
        },
        commits=4,
        lag=7,
        refresh_seconds=0.02,
        components={"store": "ok"},
        store_latency={"commit": _histogram()},
        classifier={"latency": _histogram(), "worker": {"rejected": 1}},
        engines=[{"engine": "http://e:8000", "model": "m", "hit_ratio": 0.38}],
        engine_tiers=[{"engine": "http://e:8000", "model": "m", "tier": "gpu", "hit_ratio": 0.3}],
        engine_scrape_errors=[{"engine": "http://e:8000", "reason": "timeout", "count": 1}],
    )


def spec_metric_names() -> set[str]:
    """The metric names docs/spec.md section 6 lists ("Prometheus metric names ..."), as
    families: without labels and without the counters' ``_total``."""
    spec = (Path(__file__).resolve().parents[2] / "docs" / "spec.md").read_text()
    section = spec[spec.index("Prometheus metric names") :].split("\n\n")[0]
    names = {re.sub(r"\{.*\}$", "", name) for name in re.findall(r"`(kvcast_[^`]+)`", section)}
    assert len(names) >= 15, names  # the paragraph was found and read
    return {name.removesuffix("_total") for name in names}


def test_a_fully_populated_view_gives_every_metric_a_sample() -> None:
    """Each metric reads an attribute of the documents or the view: a field renamed without
    the collector fails here (an AttributeError, or a family without samples)."""
    families = {f.name: f for f in KvcastCollector(populated_view).collect()}
    assert set(families) == set(METRICS)
    empty = sorted(name for name, family in families.items() if not family.samples)
    assert not empty, f"metrics without a sample on a fully populated view: {empty}"
    for family in families.values():
        assert all(math.isfinite(s.value) for s in family.samples if s.value is not None)
    assert spec_metric_names() <= set(families)
    gauge = {f.name: f.samples[0].value for f in families.values() if f.type == "gauge"}
    assert gauge["kvcast_event_time_seconds"] == 5_000.0
    assert gauge["kvcast_window_conversations"] == 600
    assert gauge["kvcast_forecast_error"] == pytest.approx(0.42 - 0.4)
    assert [s.labels["target"] for s in families["kvcast_required_capacity_blocks"].samples] == [
        "0.5"
    ]  # the unreachable target has no blocks, so no sample


def test_a_non_finite_forecast_value_is_left_out_as_in_its_json() -> None:
    view = populated_view()
    model = replace(view.forecast.forecast, hit_ratio=math.nan, characteristic_time_s=math.inf)
    broken = replace(view, forecast=replace(view.forecast, forecast=model))
    families = {f.name: f for f in KvcastCollector(lambda: broken).collect()}
    assert not families["kvcast_hit_ratio_forecast"].samples
    assert not families["kvcast_characteristic_time_seconds"].samples
    assert broken.forecast.to_dict()["hit_ratio"] is None
