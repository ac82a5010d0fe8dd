"""What the daemon has published, for HTTP, metrics and the status line (thread-safe reads).

The refresher (``kvcast.daemon.publisher``) writes the forecast and the table here; the
consumer loop reports its heartbeat, commits, lag and component states. HTTP handlers and
metric scrapes read one consistent copy under the lock; nothing here touches the store.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvcast.exporters.view import MetricsView
from kvcast.stats.documents import ForecastDocument, ShadowCurve, TableDocument
from kvcast.stats.partition import PartitionDelta

# The main loop must beat at least this often (s) for /healthz to say it is alive.
LIVENESS_LIMIT_S = 60.0
# /v1/status keeps a point of forecast and observed hit ratio at most every HISTORY_EVERY_S
# seconds of the forecast's computation time, the last HISTORY_POINTS of them (an hour).
HISTORY_POINTS = 120
HISTORY_EVERY_S = 30.0


class Published:
    """The published documents and the process's figures; implements the HTTP ``PublishedState``.

    ``extra_metrics``: components that report their own figures (classifier, store latency),
    each returning a dict of :class:`MetricsView` fields (e.g. ``{"store_latency": ...}``).
    """

    def __init__(
        self,
        source_health: Callable[[], tuple[bool, str]],
        clock: Callable[[], float] = time.monotonic,
        extra_metrics: Sequence[Callable[[], dict[str, Any]]] = (),
        publishing: bool = True,
    ) -> None:
        # False in a worker process (daemon/workers.py): it keeps its figures for the primary
        # process, which alone reads the window, publishes and serves.
        self.publishing = publishing
        self._source_health = source_health
        self._clock = clock
        self._extra_metrics = tuple(extra_metrics)
        self._lock = threading.Lock()
        # Typed documents; their JSON dicts are made at the first HTTP read of each one.
        self._forecast: ForecastDocument | None = None
        self._forecast_json: dict[str, Any] | None = None
        self._planner: Callable[[float, str], dict[str, Any]] | None = None
        self._table: TableDocument | None = None
        self._table_json: dict[str, Any] | None = None
        self.table_published_at = -math.inf  # clock time of the last table publication
        self._components: dict[str, str] = {"store": "not checked yet"}
        self._heartbeat = clock()
        self._counters: dict[str, Any] = {}
        # This process's stored counts (processed, duplicates, rejected:REASON), and what they
        # were when the last refresh had read the store: the counters served are the store's
        # plus this process's commits since, so "processed" moves with every commit, as the
        # rate does, not only at each refresh (every --refresh-interval).
        self._own: Counter[str] = Counter()
        self._own_at_read: Counter[str] = Counter()
        self._commits = 0
        self._lag: int | None = None
        self._refresh_seconds = 0.0
        self._events_per_s: float | None = None
        self._history: deque[dict[str, float | None]] = deque(maxlen=HISTORY_POINTS)
        self._shadow: ShadowCurve | None = None  # the shadow simulation's latest curve

    # -- written by the refresher ------------------------------------------------------------

    def refreshed(
        self,
        forecast: ForecastDocument,
        table: TableDocument | None,
        counters: dict[str, Any],
        seconds: float,
        planner: Callable[[float, str], dict[str, Any]] | None = None,
        own_at_read: Counter[str] | None = None,
    ) -> None:
        """A refresh's results; ``table`` None when the published table did not change;
        ``planner`` answers ``/v1/forecast?target=X&tier=T`` on the same sample;
        ``own_at_read``: :meth:`own_commits` once the store was read (None: now)."""
        with self._lock:
            self._own_at_read = Counter(self._own) if own_at_read is None else own_at_read
            self._planner = planner
            if self._shadow is not None:  # beside the forecast, with its error against it
                forecast = forecast.with_shadow(self._shadow)
            self._forecast, self._forecast_json = forecast, None
            if table is not None:
                self._table, self._table_json = table, None
                self.table_published_at = self._clock()
            self._counters = counters
            self._components["store"] = "ok"
            self._refresh_seconds = seconds
            at = forecast.computed_at
            last_at = self._history[-1]["at"] if self._history else None
            if last_at is None or at - last_at >= HISTORY_EVERY_S:
                self._history.append(
                    {
                        "at": at,
                        "forecast": _finite(forecast.forecast.hit_ratio),
                        "observed": _finite(forecast.forecast.observed_hit_ratio),
                    }
                )

    # -- hooks from the consumer loop --------------------------------------------------------

    def heartbeat(self) -> None:
        self._heartbeat = self._clock()

    def committed(self, partition: str, delta: PartitionDelta) -> None:
        counts = delta.counters
        with self._lock:
            self._commits += 1
            self._own["processed"] += counts.processed
            self._own["duplicates"] += counts.duplicates
            for reason, n in counts.rejected.items():
                self._own[f"rejected:{reason}"] += n

    def own_commits(self) -> Counter[str]:
        """This process's stored counts so far (the refresher marks them after its read)."""
        with self._lock:
            return Counter(self._own)

    def _counters_now(self) -> dict[str, Any]:
        """The store's counters at the last refresh plus this process's commits since (under
        the lock). A commit that raced the refresh's read is left out until the next one, never
        counted twice."""
        counters = dict(self._counters)
        since = self._own - self._own_at_read
        if not since:
            return counters
        by_reason = dict(counters.get("rejected_by_reason") or {})
        for key, n in since.items():
            if key.startswith("rejected:"):
                reason = key.removeprefix("rejected:")
                by_reason[reason] = by_reason.get(reason, 0) + n
        counters["processed"] = counters.get("processed", 0) + since["processed"]
        counters["duplicates"] = counters.get("duplicates", 0) + since["duplicates"]
        counters["rejected"] = counters.get("rejected", 0) + sum(
            n for key, n in since.items() if key.startswith("rejected:")
        )
        counters["rejected_by_reason"] = dict(sorted(by_reason.items()))
        return counters

    def set_shadow(self, document: dict[str, Any]) -> None:
        """The shadow simulation's curve (``kvcast.daemon.shadow_feed``'s document), published
        with the next refresh."""
        curve = ShadowCurve.from_dict(document)
        with self._lock:
            self._shadow = curve

    def set_lag(self, lag: int | None) -> None:
        with self._lock:
            self._lag = lag

    def set_component(self, name: str, state: str) -> None:
        with self._lock:
            self._components[name] = state

    # -- PublishedState (HTTP) ---------------------------------------------------------------

    def forecast(self) -> ForecastDocument | None:
        """The latest forecast, typed; None before the first refresh."""
        with self._lock:
            return self._forecast

    def table(self) -> TableDocument | None:
        """The latest published table, typed; None before the first publication."""
        with self._lock:
            return self._table

    def forecast_document(self) -> dict[str, Any] | None:
        """The latest forecast as its JSON document (made once per refresh; do not modify)."""
        with self._lock:
            if self._forecast_json is None and self._forecast is not None:
                self._forecast_json = self._forecast.to_dict()
            return self._forecast_json

    def table_document(self) -> dict[str, Any] | None:
        """The latest table as its JSON document (made once per table; do not modify)."""
        with self._lock:
            if self._table_json is None and self._table is not None:
                self._table_json = self._table.to_dict()
            return self._table_json

    def plan_capacity(self, target: float, tier: str) -> dict[str, Any] | None:
        """The ``required_capacity`` of ``tier`` for total hit ratio ``target`` (the tiers as
        configured, on the latest forecast's sample); None before the first forecast.
        ValueError when ``tier`` is not one of the stack's."""
        with self._lock:
            planner = self._planner
        return None if planner is None else planner(target, tier)

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

    def metrics_view(self) -> MetricsView:
        """Everything the Prometheus collector reads, in one consistent copy."""
        extra: dict[str, Any] = {}
        for report in self._extra_metrics:
            extra.update(report())
        with self._lock:
            view = MetricsView(
                forecast=self._forecast,
                table=self._table,
                counters=self._counters_now(),
                commits=self._commits,
                lag=self._lag,
                refresh_seconds=self._refresh_seconds,
                components=dict(self._components),
            )
        return replace(view, **extra)

    def status(self, events_per_s: float) -> dict[str, Any]:
        """The one-line status as a document (events/s, counters, forecast, table, lag).

        ``role`` says which process wrote it: the ``primary`` (the instance's figures) or a
        ``worker`` of ``--workers N`` (its own rate, lag and store only).
        """
        with self._lock:
            self._events_per_s = events_per_s
        view = self.metrics_view()
        if not self.publishing:  # a worker process: its own figures only
            return {
                "role": "worker",
                "events_per_s": round(events_per_s, 1),
                "lag": view.lag,
                "store": view.components.get("store"),
            }
        model = view.forecast.forecast if view.forecast is not None else None
        counters = view.counters
        return {
            "role": "primary",
            "events_per_s": round(events_per_s, 1),
            "processed": counters.get("processed", 0),
            "rejected": counters.get("rejected", 0),
            "duplicates": counters.get("duplicates", 0),
            "hit_ratio": None if model is None else _finite(model.hit_ratio),
            "hit_ratio_single_class": None
            if model is None
            else _finite(model.hit_ratio_single_class),
            "upper_bound": None if model is None else _finite(model.upper_bound),
            "observed_hit_ratio": None if model is None else _finite(model.observed_hit_ratio),
            "table_version": view.table.version if view.table is not None else None,
            "lag": view.lag,
            "store": view.components.get("store"),
        }

    def operations_document(self) -> dict[str, Any]:
        """What an operator checks first (``/v1/status``, the status page's operations card):
        events/s of this process over the last status interval (None before the first), lag,
        counters with rejections by reason, each component's state, the forecast's age (s) and
        the recent history of forecast and observed hit ratio (Unix seconds, ratios)."""
        ready, components = self.readiness()
        view = self.metrics_view()
        with self._lock:
            rate, history = self._events_per_s, list(self._history)
        computed_at = view.forecast.computed_at if view.forecast is not None else None
        counters = view.counters
        return {
            "ready": ready,
            "events_per_s": None if rate is None else round(rate, 1),
            "lag": view.lag,
            "processed": counters.get("processed", 0),
            "rejected": counters.get("rejected", 0),
            "rejected_by_reason": dict(counters.get("rejected_by_reason") or {}),
            "duplicates": counters.get("duplicates", 0),
            "components": components,
            "forecast_age_s": None if computed_at is None else max(time.time() - computed_at, 0.0),
            "table_version": view.table.version if view.table is not None else None,
            "history": history,
        }


def _finite(value: float | None) -> float | None:
    """A ratio as its JSON document has it: a plain float, None for NaN and infinities."""
    return None if value is None or not math.isfinite(value) else float(value)


def rate(events_per_s: float) -> str:
    """Events/s for the status line: whole numbers, with a decimal below 10 (a trickle of 0.4/s
    that still completes conversations and changes the table must not read as "0")."""
    return (
        f"{events_per_s:,.0f}"
        if events_per_s >= 9.95 or events_per_s == 0
        else f"{events_per_s:.1f}"
    )


def format_status(status: dict[str, Any]) -> str:
    """The status document as the human one-liner."""

    def ratio(key: str) -> str:
        value = status.get(key)
        return "-" if value is None else f"{value:.4f}"

    lag = status["lag"]
    if status["role"] == "worker":
        return (
            f"kvcast worker | {rate(status['events_per_s'])} events/s"
            f" | lag {lag if lag is not None else '-'} | store {status['store']}"
        )
    return (
        f"kvcast | {rate(status['events_per_s'])} events/s"
        f" | processed {status['processed']:,} rejected {status['rejected']:,}"
        f" duplicates {status['duplicates']:,}"
        f" | hit ratio {ratio('hit_ratio')} (single-class {ratio('hit_ratio_single_class')},"
        f" bound {ratio('upper_bound')}, observed {ratio('observed_hit_ratio')})"
        f" | table v{status['table_version'] or '-'}"
        f" | lag {lag if lag is not None else '-'} | store {status['store']}"
    )
