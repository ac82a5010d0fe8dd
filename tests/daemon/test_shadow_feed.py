"""The daemon's shadow simulation: fed what the engines accept, published beside the forecast,
exported as metrics."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.daemon.published import Published
from kvcast.daemon.publisher import Publisher
from kvcast.daemon.refresh import capacity_grid
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import ReplaySource
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.exporters.metrics import KvcastCollector
from kvcast.exporters.view import MetricsView
from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.documents import ShadowCurve
from kvcast.stats.events import parse_event
from tests.support import forecast_doc

SETTINGS = DaemonSettings(
    stats=StatsConfig(completion_timeout_s=900, allowed_lateness_s=30),
    commit_interval_s=0.01,
    refresh_interval_s=0.05,
    table_interval_s=0.01,
    status_interval_s=0.2,
    shutdown_timeout_s=2,
    capacity_blocks=300,
    shadow_sampling=1.0,
)


@pytest.fixture(scope="module")
def lines() -> list[bytes]:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=400, seed=4)
    out = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    out[50:50] = [b"not json", out[40]]  # a rejected line and a duplicate
    return out


def run_daemon(settings: DaemonSettings, lines: list[bytes], events: int | None) -> Daemon:
    """Run until everything is committed and (``events``) a forecast carries a shadow that has
    seen that many events."""
    store, source = MemoryStore(), ReplaySource(lines, partition="p:0")
    publisher = Publisher(settings, store, source.health)
    daemon = Daemon(settings, store, source, publisher)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    deadline = time.monotonic() + 30

    def done() -> bool:
        if not (daemon._flushed and not daemon._uncommitted()):
            return False
        if events is None:
            return publisher.published.forecast_document() is not None
        shadow = (publisher.published.forecast_document() or {}).get("shadow")
        return shadow is not None and shadow["events"] == events

    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    daemon.request_stop()
    thread.join(timeout=10)
    assert not thread.is_alive() and done()
    return daemon


def test_the_shadow_sees_the_accepted_events_and_is_published_beside_the_forecast(
    lines: list[bytes],
) -> None:
    unique = [parse_event(line) for line in lines if line != b"not json"]
    unique = unique[:50] + unique[51:]  # the duplicate (of line 40, at 51) is applied once
    daemon = run_daemon(SETTINGS, lines, events=len(unique))
    forecast = daemon.published.forecast_document()
    assert forecast is not None
    shadow = forecast["shadow"]
    assert shadow["sampling_ratio"] == 1.0 and shadow["effectively_once"] is False
    assert [p["capacity_blocks"] for p in shadow["curve"]] == capacity_grid(300)
    # At rate 1 the shadow is the exact block-level LRU simulation of the accepted events.
    trace = SimTrace.from_columns(
        [e.session_id for e in unique],
        [e.turn for e in unique],
        [e.timestamp for e in unique],
        [e.input_tokens for e in unique],
    )
    exact = simulate(trace, 300, "lru", "block", 0.0, 0.0)
    assert shadow["capacity_blocks"] == 300.0
    assert shadow["hit_ratio"] == exact.hit_ratio
    assert shadow["kept_accesses"] == exact.input_blocks
    assert shadow["forecast_error"] == pytest.approx(forecast["hit_ratio"] - exact.hit_ratio)


def test_sampling_zero_turns_the_shadow_off(lines: list[bytes]) -> None:
    daemon = run_daemon(replace(SETTINGS, shadow_sampling=0.0), lines, events=None)
    assert daemon.shadow is None
    forecast = daemon.published.forecast_document()
    assert forecast is not None and "shadow" not in forecast


def shadow_document(hit_ratio: float | None, curve: list[dict] | None = None) -> dict:
    """A shadow feed document (``ShadowFeed.document()``'s keys) with this hit ratio."""
    return {
        "hit_ratio": hit_ratio,
        "capacity_blocks": 300.0,
        "curve": curve or [],
        "sampling_ratio": 0.05,
        "session_share": 1.0,
        "kept_accesses": 5_000,
        "window_start": 0.0,
        "events": 900,
        "cached_blocks": 12,
        "effectively_once": False,
    }


def test_the_forecast_error_is_forecast_minus_shadow() -> None:
    shadow = ShadowCurve.from_dict(shadow_document(0.25))
    assert shadow.against(0.4).forecast_error == pytest.approx(0.15)
    assert shadow.against(None).forecast_error is None
    assert ShadowCurve.from_dict(shadow_document(None)).against(0.4).forecast_error is None
    published = Published(lambda: (True, "ok"))
    published.refreshed(forecast_doc(hit_ratio=0.3), None, {}, 0.0)
    assert "shadow" not in (published.forecast_document() or {})  # nothing simulated yet
    published.set_shadow(shadow_document(0.25))
    published.refreshed(forecast_doc(hit_ratio=0.3), None, {}, 0.0)
    assert published.forecast_document()["shadow"]["forecast_error"] == pytest.approx(0.05)


def test_a_shadow_document_with_a_renamed_key_is_refused() -> None:
    document = shadow_document(0.25)
    document["sampled"] = document.pop("sampling_ratio")
    with pytest.raises(ValueError, match=r"unknown keys \['sampled'\].*\['sampling_ratio'\]"):
        Published(lambda: (True, "ok")).set_shadow(document)


def test_the_shadow_metrics_come_from_the_published_shadow() -> None:
    curve = [
        {"capacity_blocks": 150.5, "hit_ratio": 0.1},
        {"capacity_blocks": 300.0, "hit_ratio": 0.2},
        {"capacity_blocks": 600.0, "hit_ratio": None},
    ]
    shadow = ShadowCurve.from_dict(shadow_document(0.2, curve))
    forecast = forecast_doc(hit_ratio=0.3).with_shadow(shadow)
    families = {
        f.name: f for f in KvcastCollector(lambda: MetricsView(forecast=forecast)).collect()
    }
    simulated = {
        s.labels["capacity_blocks"]: s.value for s in families["kvcast_hit_ratio_simulated"].samples
    }
    assert simulated == {"150": 0.1, "300": 0.2}  # nothing measured at 600 yet
    assert families["kvcast_forecast_error"].samples[0].value == pytest.approx(0.1)
    assert families["kvcast_shadow_sampling_ratio"].samples[0].value == 0.05
    bare_view = MetricsView(forecast=forecast_doc(hit_ratio=0.3))
    bare = {f.name: f for f in KvcastCollector(lambda: bare_view).collect()}
    for name in (
        "kvcast_hit_ratio_simulated",
        "kvcast_forecast_error",
        "kvcast_shadow_sampling_ratio",
    ):
        assert not bare[name].samples


def test_the_flag_sets_the_sampling_and_refuses_rates_outside_0_1() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["run", "--shadow-sampling", "0.2", "--print-config"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["shadow_sampling"] == 0.2
    assert (
        orjson.loads(runner.invoke(cli, ["run", "--print-config"]).stdout)["shadow_sampling"]
        == DaemonSettings().shadow_sampling
    )
    assert runner.invoke(cli, ["run", "--shadow-sampling", "1.5", "--print-config"]).exit_code != 0
    with pytest.raises(ValueError, match="shadow_sampling"):
        DaemonSettings(shadow_sampling=-0.1)
