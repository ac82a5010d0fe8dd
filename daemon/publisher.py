"""What the daemon publishes: the forecast and the table, recomputed from the store on a timer.

The refresher thread reads the shared window from the store (so every instance publishes the
statistics of all partitions, not only its own), forecasts, and republishes the priority
table when its content changed. HTTP handlers and metric scrapes read the results under a
lock; nothing here touches the consumer.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores import StateStore, StoreUnavailable
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.partition import PartitionDelta
from kvcast.stats.priority import table_content_changed, table_document
from kvcast.stats.snapshot import take_snapshot

log = logging.getLogger(__name__)

# The main loop must beat at least this often (s) for /healthz to say it is alive.
LIVENESS_LIMIT_S = 60.0
CURVE_POINTS = 17  # capacities from N/16 to 16N, geometric, N in the middle


def capacity_grid(capacity_blocks: int) -> list[float]:
    """Capacities (blocks) for the published curve: N/16 .. 16N, geometric, N included."""
    half = CURVE_POINTS // 2
    return [capacity_blocks * 2 ** ((i - half) / 2) for i in range(CURVE_POINTS)]


class Publisher:
    """Owns the refresher thread and the published documents (thread-safe reads)."""

    def __init__(
        self,
        settings: DaemonSettings,
        store: StateStore,
        source_health: Callable[[], tuple[bool, str]],
        clock: Callable[[], float] = time.monotonic,
        extra_metrics: Sequence[Callable[[], dict[str, Any]]] = (),
        publishing: bool = True,
    ) -> None:
        self.settings = settings
        # False in a worker process (daemon/workers.py): it keeps its figures for the primary
        # process, which alone reads the window, publishes and serves.
        self.publishing = publishing
        self.store = store
        self._source_health = source_health
        self._clock = clock
        # Components that report their own figures (classifier, store latency): each returns
        # a dict merged into metrics_view().
        self._extra_metrics = tuple(extra_metrics)
        self._lock = threading.Lock()
        self._forecast: dict[str, Any] | None = None
        self._table: dict[str, Any] | None = None
        self._table_published_at = -math.inf
        self._components: dict[str, str] = {"store": "not checked yet"}
        self._heartbeat = clock()
        self._counters: dict[str, Any] = {}
        self._commits = 0
        self._lag: int | None = None
        self._refresh_seconds = 0.0
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if not self.publishing:
            return
        self._thread = threading.Thread(target=self._loop, name="kvcast-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self.publishing:
            return
        try:
            self.refresh_once()  # the final state, after the last commit
        except StoreUnavailable as exc:
            log.warning("final refresh skipped: %s", exc)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self.refresh_once()
            except StoreUnavailable as exc:
                self.set_component("store", f"unavailable: {exc}")
            except Exception:  # keep publishing the last good state; never die silently
                log.exception("refresh failed")
            self._wake.wait(self.settings.refresh_interval_s)
            self._wake.clear()

    def refresh_soon(self) -> None:
        self._wake.set()

    # -- hooks from the consumer loop --------------------------------------------------------

    def heartbeat(self) -> None:
        self._heartbeat = self._clock()

    def committed(self, partition: str, delta: PartitionDelta) -> None:
        with self._lock:
            self._commits += 1

    def set_lag(self, lag: int | None) -> None:
        with self._lock:
            self._lag = lag

    def set_component(self, name: str, state: str) -> None:
        with self._lock:
            self._components[name] = state

    # -- the refresh -------------------------------------------------------------------------

    def refresh_once(self) -> None:
        started = time.perf_counter()
        config = self.settings.stats
        state = self.store.load_window(config)
        now = state.newest_event_time if math.isfinite(state.newest_event_time) else None
        snapshot = take_snapshot(state.window, state.arrivals, config, now)
        common = {
            "capacity_blocks": self.settings.capacity_blocks,
            "block_size": config.block_size,
            "instances": self.settings.instances,
            "kv_bytes_per_token": self.settings.kv_bytes_per_token,
        }
        forecast = forecast_from_sample(
            snapshot.sample, capacities=capacity_grid(self.settings.capacity_blocks), **common
        ).to_dict()
        forecast["required_capacity_by_target"] = [
            forecast_from_sample(snapshot.sample, target=target, **common).to_dict()[
                "required_capacity"
            ]
            for target in self.settings.target_hit_ratios
        ]
        forecast["event_time"] = now
        forecast["window_conversations"] = snapshot.window_conversations
        forecast["computed_at"] = time.time()
        with self._lock:
            previous = self._table
        version = previous["version"] if previous is not None else self._stored_table_version()
        table = table_document(snapshot, config, version)
        # Nothing observed yet and nothing published before: engines use the defaults anyway.
        warming_up = previous is None and not table["states"] and version == 0
        publish = (
            not warming_up
            and table_content_changed(previous, table)
            and (
                previous is None
                or self._clock() - self._table_published_at >= self.settings.table_interval_s
            )
        )
        if publish:
            table["version"] = version + 1
            self.store.publish_table(table)
            self._table_published_at = self._clock()
        self._expire(state, snapshot)
        with self._lock:
            self._forecast = forecast
            if publish:
                self._table = table
            self._counters = state.counters.to_dict()
            self._components["store"] = "ok"
            self._refresh_seconds = time.perf_counter() - started

    def _stored_table_version(self) -> int:
        stored = self.store.read_table()
        return int(stored["version"]) if stored is not None else 0

    def _expire(self, state: Any, snapshot: Any) -> None:
        chosen = {id(b) for b in state.window.buckets_in_window(snapshot.generated_at)}
        kept = [index for index, bucket in state.window.buckets.items() if id(bucket) in chosen]
        if not kept or not math.isfinite(state.arrivals.newest_start):
            return
        second_before = math.floor(state.arrivals.newest_start) - self.settings.stats.rate_window_s
        self.store.expire(min(kept), second_before + 1)

    # -- PublishedState (HTTP) ---------------------------------------------------------------

    def forecast_document(self) -> dict[str, Any] | None:
        with self._lock:
            return self._forecast

    def table_document(self) -> dict[str, Any] | None:
        with self._lock:
            return self._table

    def readiness(self) -> tuple[bool, dict[str, str]]:
        source_ok, source_detail = self._source_health()
        with self._lock:
            components = dict(self._components)
            components["source"] = source_detail if not source_ok else "ok"
            components["forecast"] = "ok" if self._forecast is not None else "warming up"
        return all(v == "ok" for v in components.values()), components

    def liveness(self) -> tuple[bool, str]:
        silent = self._clock() - self._heartbeat
        if silent > LIVENESS_LIMIT_S:
            return False, f"main loop silent for {silent:.0f} s"
        return True, "ok"

    # -- status and metrics ------------------------------------------------------------------

    def metrics_view(self) -> dict[str, Any]:
        """Everything the Prometheus collector reads, in one consistent copy."""
        extra: dict[str, Any] = {}
        for report in self._extra_metrics:
            extra.update(report())
        with self._lock:
            return {
                **extra,
                "forecast": self._forecast,
                "table": self._table,
                "counters": dict(self._counters),
                "commits": self._commits,
                "lag": self._lag,
                "refresh_seconds": self._refresh_seconds,
                "components": dict(self._components),
            }

    def status(self, events_per_s: float) -> dict[str, Any]:
        """The one-line status as a document (events/s, counters, forecast, table, lag).

        ``role`` says which process wrote it: the ``primary`` (the instance's figures) or a
        ``worker`` of ``--workers N`` (its own rate, lag and store only).
        """
        view = self.metrics_view()
        if not self.publishing:  # a worker process: its own figures only
            return {
                "role": "worker",
                "events_per_s": round(events_per_s, 1),
                "lag": view["lag"],
                "store": view["components"].get("store"),
            }
        forecast = view["forecast"] or {}
        counters = view["counters"]
        return {
            "role": "primary",
            "events_per_s": round(events_per_s, 1),
            "processed": counters.get("processed", 0),
            "rejected": counters.get("rejected", 0),
            "duplicates": counters.get("duplicates", 0),
            "hit_ratio": forecast.get("hit_ratio"),
            "hit_ratio_single_class": forecast.get("hit_ratio_single_class"),
            "upper_bound": forecast.get("upper_bound"),
            "observed_hit_ratio": forecast.get("observed_hit_ratio"),
            "table_version": view["table"]["version"] if view["table"] else None,
            "lag": view["lag"],
            "store": view["components"].get("store"),
        }


def format_status(status: dict[str, Any]) -> str:
    """The status document as the human one-liner."""

    def ratio(key: str) -> str:
        value = status.get(key)
        return "-" if value is None else f"{value:.4f}"

    lag = status["lag"]
    if status["role"] == "worker":
        return (
            f"kvcast worker | {status['events_per_s']:,.0f} events/s"
            f" | lag {lag if lag is not None else '-'} | store {status['store']}"
        )
    return (
        f"kvcast | {status['events_per_s']:,.0f} events/s"
        f" | processed {status['processed']:,} rejected {status['rejected']:,}"
        f" duplicates {status['duplicates']:,}"
        f" | hit ratio {ratio('hit_ratio')} (single-class {ratio('hit_ratio_single_class')},"
        f" bound {ratio('upper_bound')}, observed {ratio('observed_hit_ratio')})"
        f" | table v{status['table_version'] or '-'}"
        f" | lag {lag if lag is not None else '-'} | store {status['store']}"
    )
