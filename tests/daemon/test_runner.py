"""The daemon loop in-process: finite sources, store outages, stale owners, shutdown."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from kvcast.daemon.publisher import Publisher
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import ReplaySource
from kvcast.daemon.stores import StoreUnavailable
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.lab.bench.processes import wait_until
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.replay import Pipeline
from kvcast.stats.snapshot import take_snapshot

STATS = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30)
SETTINGS = DaemonSettings(
    stats=STATS,
    commit_interval_s=0.01,
    commit_max_events=97,
    max_uncommitted_events=500,
    refresh_interval_s=0.05,
    table_interval_s=0.01,
    status_interval_s=0.2,
    shutdown_timeout_s=2,
    max_backoff_s=0.05,
)


@pytest.fixture(scope="module")
def lines() -> list[bytes]:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=500, seed=5, prompts=False)
    out = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    out[100:100] = [b"not json", out[90]]  # a rejected line and a duplicate
    return out


def reference(lines: list[bytes]) -> StatsEngine:
    pipeline = Pipeline(STATS)
    pipeline.offer_all(lines)
    pipeline.engine.finish()
    return pipeline.engine


def stored(store: MemoryStore) -> tuple:
    state = store.load_window(STATS)
    snap = take_snapshot(state.window, state.arrivals, STATS, state.newest_event_time)
    return snap, state.counters


def run_until_flushed(daemon: Daemon, source: ReplaySource, timeout_s: float = 20) -> int:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(daemon.run()))
    thread.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (daemon._flushed and not daemon._uncommitted()):
        time.sleep(0.02)
    daemon.request_stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return result[0]


class FlakyStore(MemoryStore):
    """A memory store that is unreachable for its first ``down_calls`` commits and loads; then,
    when ``up_calls`` is set, answers that many and is unreachable again from then on."""

    def __init__(self, down_calls: int, up_calls: int | None = None) -> None:
        super().__init__()
        self.down_calls = down_calls
        self.up_calls = up_calls
        self.failures = 0

    def _maybe_fail(self) -> None:
        if self.down_calls > 0:
            self.down_calls -= 1
            self.failures += 1
            raise StoreUnavailable("injected outage")
        if self.up_calls is not None:
            if self.up_calls <= 0:
                self.failures += 1
                raise StoreUnavailable("injected outage")
            self.up_calls -= 1

    def commit(self, delta):  # type: ignore[no-untyped-def]
        self._maybe_fail()
        super().commit(delta)

    def load_partition(self, partition):  # type: ignore[no-untyped-def]
        self._maybe_fail()
        return super().load_partition(partition)


def make_daemon(
    store: MemoryStore,
    lines: list[bytes],
    settings: DaemonSettings = SETTINGS,
    speedup: float | None = None,
):
    source = ReplaySource(lines, partition="p:0", speedup=speedup)
    publisher = Publisher(settings, store, source.health)
    return Daemon(settings, store, source, publisher), source, publisher


def test_a_finite_source_ends_with_the_reference_statistics(lines: list[bytes]) -> None:
    store = MemoryStore()
    daemon, source, publisher = make_daemon(store, lines)
    assert run_until_flushed(daemon, source) == 0
    snap, counters = stored(store)
    expected = reference(lines)
    assert snap.states == expected.snapshot().states
    assert snap.sample.by_intent == expected.snapshot().sample.by_intent
    assert counters.processed == expected.counters.processed
    assert counters.duplicates == 1 and counters.rejected == {"invalid_json": 1}
    forecast = publisher.published.forecast_document()
    assert forecast is not None
    assert forecast["window_conversations"] == expected.snapshot().window_conversations
    table = publisher.published.table_document()
    assert table is not None and store.read_table() == table
    assert [s["conversations"] for s in table["states"]] == [
        s.conversations for s in expected.snapshot().states
    ]


def test_a_store_outage_delays_but_never_loses_or_doubles(lines: list[bytes]) -> None:
    store = FlakyStore(down_calls=25)
    daemon, source, publisher = make_daemon(store, lines)
    assert run_until_flushed(daemon, source) == 0
    assert store.failures == 25
    snap, counters = stored(store)
    expected = reference(lines)
    assert snap.states == expected.snapshot().states
    assert counters.processed == expected.counters.processed
    assert publisher.published.readiness()[1]["store"] == "ok"


def test_consumption_pauses_while_too_much_awaits_the_store(lines: list[bytes]) -> None:
    store = FlakyStore(down_calls=10**9)
    daemon, source, _ = make_daemon(store, lines)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        wait_until(lambda: store.failures >= 2, 30, "the partition load to be refused twice")
        # The load failed and was retried: nothing may be consumed without a checkpoint.
        assert daemon.events_seen == 0 and source.lag() == len(lines)
        # Up for the load and two commits, then down for good: the loop goes on consuming up
        # to the uncommitted bound, then pauses with part of the log still to read.
        store.up_calls = 3
        store.down_calls = 0
        wait_until(lambda: daemon._paused_for_store, 30, "consumption to pause for the store")
        assert daemon._uncommitted() <= SETTINGS.max_uncommitted_events
        assert source.lag() > 0
        seen, refused = daemon.events_seen, store.failures
        wait_until(lambda: store.failures >= refused + 3, 30, "three more refused commits")
        assert daemon.events_seen == seen  # paused while the commits retry, not spinning
        store.up_calls = None  # the store is back: the stop drains
    finally:
        daemon.request_stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_shutdown_gives_up_after_the_timeout_when_the_store_stays_down(
    lines: list[bytes],
) -> None:
    store = MemoryStore()
    settings = replace(SETTINGS, shutdown_timeout_s=0.3)
    # Paced, so events are still arriving when the store goes away.
    daemon, _source, _ = make_daemon(store, lines, settings, speedup=500)
    thread_result: list[int] = []
    thread = threading.Thread(target=lambda: thread_result.append(daemon.run()))
    thread.start()
    time.sleep(0.3)

    def down(delta):  # type: ignore[no-untyped-def]
        raise StoreUnavailable("gone")

    store.commit = down  # type: ignore[method-assign]
    time.sleep(0.1)
    started = time.monotonic()
    daemon.request_stop()
    thread.join(timeout=10)
    assert thread_result == [1]
    assert time.monotonic() - started < 3


def test_a_restart_resumes_from_the_checkpoint(lines: list[bytes]) -> None:
    store = MemoryStore()
    first, first_source, _ = make_daemon(store, lines, speedup=2000)
    thread = threading.Thread(target=first.run)
    thread.start()
    while first_source.lag() > len(lines) // 2:
        time.sleep(0.01)
    first.request_stop()  # SIGTERM half-way: what was applied is committed, nothing flushed
    thread.join(timeout=10)
    applied = first.events_seen
    assert 0 < applied < len(lines) and not first._flushed
    second, second_source, _ = make_daemon(store, lines)
    assert run_until_flushed(second, second_source) == 0
    assert second.events_seen == len(lines) - applied
    snap, counters = stored(store)
    expected = reference(lines)
    assert snap.states == expected.snapshot().states
    assert counters.processed == expected.counters.processed


def test_settings_reject_bad_values_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="metrics_addr"):
        DaemonSettings(metrics_addr="nowhere")
    with pytest.raises(ValueError, match="store"):
        DaemonSettings(store="postgres://x")
    with pytest.raises(ValueError, match="kafka://HOST:PORT/TOPIC"):
        DaemonSettings(source="kafka://broker:9092")
    with pytest.raises(ValueError, match="namespace"):
        DaemonSettings(namespace="has space")
    with pytest.raises(ValueError, match=r"target_hit_ratios must be .*, got 1\.5"):
        DaemonSettings(target_hit_ratios=(1.5,))
