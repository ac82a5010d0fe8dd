"""What ``kvcast run`` publishes for a tiered cache: the forecast's ``tiers``, the per-tier
gauge, and the planner behind ``/v1/forecast?target=X&tier=T`` (real store, real refresh, real
HTTP server)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvcast.daemon.publisher import Publisher
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.exporters.http_server import HttpServer
from kvcast.exporters.metrics import build_registry
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.snapshot import take_snapshot
from kvcast.stats.tiers import Tier
from tests.daemon.test_refresh import STATS, fill, workload

SETTINGS = DaemonSettings(
    stats=STATS,
    capacity_blocks=400,
    tiers=(Tier("host", 800), Tier("disk", 3200)),
    kv_bytes_per_token=1024,
)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Publisher, MemoryStore]]:
    store = MemoryStore()
    fill(store, STATS, workload(conversations=300, seed=21))
    publisher = Publisher(SETTINGS, store, lambda: (True, "ok"))
    publisher.refresh_once()
    published = publisher.published
    server = HttpServer("127.0.0.1", 0, published, build_registry(published.metrics_view))
    server.start()
    yield server.url, publisher, store
    server.close()


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, orjson.loads(error.read())


def _sample(store: MemoryStore) -> Any:
    state = store.load_window(STATS)
    return take_snapshot(
        state.window, state.arrivals, STATS, state.newest_event_time, age_limited=False
    ).sample


def test_the_forecast_has_every_tier(served) -> None:
    url, _, store = served
    status, doc = get(url + "/v1/forecast")
    assert status == 200
    assert doc["tier_mode"] == "exclusive"
    assert [(t["name"], t["capacity_blocks"]) for t in doc["tiers"]] == [
        ("gpu", 400), ("host", 800), ("disk", 3200),
    ]  # fmt: skip
    assert doc["tiers"][0]["hit_ratio"] == doc["hit_ratio"]
    whole = forecast_from_sample(_sample(store), 4400, STATS.block_size).hit_ratio
    assert sum(t["hit_ratio"] for t in doc["tiers"]) == pytest.approx(whole)
    assert doc["tiers"][1]["hit_ratio"] > 0


def test_the_tier_gauge_has_one_series_per_tier(served) -> None:
    url, publisher, _ = served
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    family = families["kvcast_hit_ratio_forecast_tier"]
    assert family.type == "gauge"
    got = {s.labels["tier"]: s.value for s in family.samples}
    tiers = publisher.published.forecast_document()["tiers"]
    assert got == pytest.approx({t["name"]: t["hit_ratio"] for t in tiers})


@pytest.mark.parametrize("tier", ["gpu", "host", "disk"])
def test_the_planner_answers_for_each_tier(served, tier: str) -> None:
    url, _, store = served
    status, doc = get(f"{url}/v1/forecast?target=0.5&tier={tier}")
    assert status == 200
    expected = forecast_from_sample(
        _sample(store), 400, STATS.block_size, target=0.5, kv_bytes_per_token=1024,
        tiers=SETTINGS.tiers, target_tier=tier,
    ).to_dict()["required_capacity"]  # fmt: skip
    assert doc["required_capacity"] == expected
    assert expected["tier"] == tier and expected["status"] in ("ok", "already_reached")
    if tier == "gpu":
        status, plain = get(f"{url}/v1/forecast?target=0.5")
        assert plain["required_capacity"] == expected


def test_unreachable_and_reached_targets_say_so(served) -> None:
    url, _, _ = served
    _, doc = get(url + "/v1/forecast")
    status, high = get(f"{url}/v1/forecast?target=0.999&tier=host")
    assert status == 200 and high["required_capacity"]["status"] == "unreachable"
    low = doc["tiers"][0]["hit_ratio"] / 2
    status, reached = get(f"{url}/v1/forecast?target={low}&tier=host")
    assert status == 200
    assert reached["required_capacity"] | {"target": None} == {
        "target": None, "blocks": 0, "bytes": 0, "status": "already_reached", "tier": "host",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("target=abc", "target"),
        ("target=0", "target"),
        ("target=1.5", "target"),
        ("target=nan", "target"),
        ("target=", "target"),
        ("tier=host", "target"),
        ("target=0.5&tier=ssd", "tier"),
        ("target=0.5&tier=%3Cscript%3E", "tier"),
        ("target=0.5&target=0.6", "target"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(served, query: str, parameter: str) -> None:
    url, _, _ = served
    status, doc = get(f"{url}/v1/forecast?{query}")
    assert status == 400
    assert doc["parameter"] == parameter and parameter in doc["error"]
    assert "script" not in doc["error"]  # the value is not echoed
