"""Every Prometheus metric kvcast exports, declared here and read at scrape time.

A custom collector turns the daemon's :class:`~kvcast.exporters.view.MetricsView` into
metric families when Prometheus scrapes, so business code never calls a metrics client.
``describe()`` is defined so registering the collector does not trigger a collection. Label
cardinality is bounded:
``intent`` by the taxonomy (and ``--taxonomy-file``; any other is ``unknown``), ``turn`` by
``max_turn`` (32), ``reason`` by the fixed rejection reasons, ``target`` by configuration,
``engine`` and ``model`` by the ``--engine-metrics`` endpoints and the models they serve,
``tier`` (engine side) by ``MAX_TIERS_PER_MODEL`` names of the engines' own,
``capacity_blocks`` by the published curve (17 points), ``tier`` by the configured tiers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.registry import Collector

from kvcast.exporters.view import MetricsView
from kvcast.stats.documents import ForecastDocument, ShadowCurve, TableDocument

# name -> (kind, help ending in its unit in brackets, labels); kinds: gauge, counter, info,
# histogram. Counters are exposed with `_total`, info as `_info`.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "kvcast_hit_ratio_forecast": (
        "gauge",
        "Forecast prefix-cache hit ratio (intent-aware, 0-1).",
        (),
    ),
    "kvcast_hit_ratio_forecast_tier": (
        "gauge",
        "Forecast share of input blocks served from each cache tier, gpu included; the tiers "
        "add up to the stack's hit ratio (0-1).",
        ("tier",),
    ),
    "kvcast_hit_ratio_forecast_single_class": (
        "gauge",
        "Forecast hit ratio of the paper's single-class estimator (0-1).",
        (),
    ),
    "kvcast_hit_ratio_upper_bound": ("gauge", "Hit ratio ceiling A_H_hash / A_R (0-1).", ()),
    "kvcast_hit_ratio_observed": (
        "gauge",
        "Hit ratio engines reported via cached_tokens over the rate window (0-1).",
        (),
    ),
    "kvcast_engine_hit_ratio": (
        "gauge",
        "Prefix-cache hit ratio an engine reports, over its last scrapes (0-1).",
        ("engine", "model"),
    ),
    "kvcast_engine_hit_ratio_tier": (
        "gauge",
        "Share of an engine's input tokens served from one cache tier, over its last scrapes"
        " (0-1).",
        ("engine", "model", "tier"),
    ),
    "kvcast_engine_scrape_errors": (
        "counter",
        "Failed or rejected scrapes of an --engine-metrics endpoint, by reason (scrapes).",
        ("engine", "reason"),
    ),
    "kvcast_hit_ratio_simulated": (
        "gauge",
        "Hit ratio of the sampled shadow LRU simulation of the stream, by capacity (0-1).",
        ("capacity_blocks",),
    ),
    "kvcast_forecast_error": (
        "gauge",
        "Forecast hit ratio minus the shadow simulation's at the configured capacity (ratio).",
        (),
    ),
    "kvcast_shadow_sampling_ratio": (
        "gauge",
        "Fraction of KV blocks the shadow simulation keeps (--shadow-sampling, 0-1).",
        (),
    ),
    "kvcast_characteristic_time_seconds": ("gauge", "LRU characteristic time T_C (seconds).", ()),
    "kvcast_conversation_arrival_rate": (
        "gauge",
        "New conversations over the rate window, all instances (conversations/s).",
        (),
    ),
    "kvcast_capacity_blocks": ("gauge", "Configured KV capacity per instance (blocks).", ()),
    "kvcast_required_capacity_blocks": (
        "gauge",
        "Capacity per instance needed for the target hit ratio (blocks).",
        ("target",),
    ),
    "kvcast_continuation_probability": (
        "gauge",
        "P(next turn | intent, turn) from the window (0-1).",
        ("intent", "turn"),
    ),
    "kvcast_reuse_median_seconds": (
        "gauge",
        "Median reuse delay exp(mu) of a state (seconds).",
        ("intent", "turn"),
    ),
    "kvcast_window_conversations": (
        "gauge",
        "Completed conversations in the statistics window (conversations).",
        (),
    ),
    "kvcast_event_time_seconds": (
        "gauge",
        "Newest event time in the shared statistics, on the events' own clock (seconds).",
        (),
    ),
    "kvcast_events": (
        "counter",
        "Valid, first-seen events processed by all instances (events).",
        (),
    ),
    "kvcast_events_rejected": ("counter", "Events rejected, by reason (events).", ("reason",)),
    "kvcast_events_duplicate": (
        "counter",
        "Duplicate events (same request_id) ignored (events).",
        (),
    ),
    "kvcast_commits": ("counter", "Atomic state commits by this instance (commits).", ()),
    "kvcast_table_version": (
        "gauge",
        "Version of the published priority table (a counter of versions).",
        (),
    ),
    "kvcast_forecast_age_seconds": ("gauge", "Time since the forecast was computed (seconds).", ()),
    "kvcast_forecast_compute_seconds": (
        "gauge",
        "Duration of the last store read + forecast + table refresh (seconds).",
        (),
    ),
    "kvcast_consumer_lag_events": (
        "gauge",
        "Events in this instance's partitions not yet read (events).",
        (),
    ),
    "kvcast_store_up": (
        "gauge",
        "Whether the state store answered the last operation (1 or 0).",
        (),
    ),
    "kvcast_store_operation_seconds": (
        "histogram",
        "State store operation time, by operation (seconds).",
        ("operation",),
    ),
    "kvcast_classifier_latency_seconds": (
        "histogram",
        "Classifier answer time per request, submit to answer (seconds).",
        (),
    ),
    "kvcast_classifier_fallbacks": (
        "counter",
        "Requests labelled unknown by the classifier stage, by reason (requests).",
        ("reason",),
    ),
    "kvcast_build": ("info", "kvcast build (version label; value always 1).", ()),
}


def _forecast_gauges(doc: ForecastDocument) -> dict[str, float | None]:
    """The unlabelled gauges read from a forecast document's attributes."""
    model = doc.forecast
    return {
        "kvcast_hit_ratio_forecast": model.hit_ratio,
        "kvcast_hit_ratio_forecast_single_class": model.hit_ratio_single_class,
        "kvcast_hit_ratio_upper_bound": model.upper_bound,
        "kvcast_hit_ratio_observed": model.observed_hit_ratio,
        "kvcast_characteristic_time_seconds": model.characteristic_time_s,
        "kvcast_conversation_arrival_rate": model.lambda0,
        "kvcast_capacity_blocks": model.capacity_blocks,
        "kvcast_window_conversations": doc.window_conversations,
        "kvcast_event_time_seconds": doc.event_time,
    }


def _finite(value: float | None) -> float | None:
    """``value`` as a float, None when unknown or not finite (such a gauge has no sample, as
    its JSON document has null there)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _family(name: str) -> Any:
    kind, help_text, labels = METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    if kind == "info":
        return InfoMetricFamily(name, help_text)
    if kind == "histogram":
        return HistogramMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


class KvcastCollector(Collector):
    """Reads ``view()`` (the daemon's ``Published.metrics_view``) once per scrape."""

    def __init__(self, view: Callable[[], MetricsView]) -> None:
        self._view = view
        try:
            self._version = version("kvcast")
        except PackageNotFoundError:
            self._version = "unknown"

    def describe(self) -> Iterator[Any]:
        for name in METRICS:
            yield _family(name)

    def collect(self) -> Iterator[Any]:
        view = self._view()
        families = {name: _family(name) for name in METRICS}
        if view.forecast is not None:
            self._forecast(view.forecast, families)
        if view.table is not None:
            self._table(view.table, families)
        counters = view.counters
        families["kvcast_events"].add_metric([], float(counters.get("processed", 0)))
        families["kvcast_events_duplicate"].add_metric([], float(counters.get("duplicates", 0)))
        for reason, count in (counters.get("rejected_by_reason") or {}).items():
            families["kvcast_events_rejected"].add_metric([reason], float(count))
        families["kvcast_commits"].add_metric([], float(view.commits))
        families["kvcast_forecast_compute_seconds"].add_metric([], view.refresh_seconds)
        if view.lag is not None:
            families["kvcast_consumer_lag_events"].add_metric([], float(view.lag))
        store_state = view.components.get("store")
        families["kvcast_store_up"].add_metric([], 1.0 if store_state == "ok" else 0.0)
        families["kvcast_build"].add_metric([], {"version": self._version})
        for engine in view.engines:
            families["kvcast_engine_hit_ratio"].add_metric(
                [engine["engine"], engine["model"]], float(engine["hit_ratio"])
            )
        for tier in view.engine_tiers:
            families["kvcast_engine_hit_ratio_tier"].add_metric(
                [tier["engine"], tier["model"], tier["tier"]], float(tier["hit_ratio"])
            )
        for error in view.engine_scrape_errors:
            families["kvcast_engine_scrape_errors"].add_metric(
                [error["engine"], error["reason"]], float(error["count"])
            )
        self._classifier(view.classifier, families)
        for operation, latency in view.store_latency.items():
            families["kvcast_store_operation_seconds"].add_metric(
                [operation], buckets=_buckets(latency), sum_value=latency["sum"]
            )
        yield from families.values()

    @classmethod
    def _forecast(cls, doc: ForecastDocument, families: dict[str, Any]) -> None:
        for name, value in _forecast_gauges(doc).items():
            if (value := _finite(value)) is not None:
                families[name].add_metric([], value)
        for tier in doc.forecast.tiers:
            if (share := _finite(tier.hit_ratio)) is not None:
                families["kvcast_hit_ratio_forecast_tier"].add_metric([tier.name], share)
        for required in doc.required_capacity_by_target:
            if required is not None and required.blocks is not None:
                families["kvcast_required_capacity_blocks"].add_metric(
                    [f"{required.target:g}"], float(required.blocks)
                )
        if doc.shadow is not None:
            cls._shadow(doc.shadow, families)
        families["kvcast_forecast_age_seconds"].add_metric(
            [], max(time.time() - doc.computed_at, 0.0)
        )

    @staticmethod
    def _table(table: TableDocument, families: dict[str, Any]) -> None:
        families["kvcast_table_version"].add_metric([], float(table.version))
        for state in table.states:
            labels = [state.intent, str(state.turn)]
            families["kvcast_continuation_probability"].add_metric(labels, state.p_continue)
            families["kvcast_reuse_median_seconds"].add_metric(labels, state.median_reuse_s)

    @staticmethod
    def _shadow(shadow: ShadowCurve, families: dict[str, Any]) -> None:
        families["kvcast_shadow_sampling_ratio"].add_metric([], float(shadow.sampling_ratio))
        for point in shadow.curve:
            if point.hit_ratio is not None:  # capacities label as whole blocks
                families["kvcast_hit_ratio_simulated"].add_metric(
                    [f"{point.capacity_blocks:.0f}"], float(point.hit_ratio)
                )
        if shadow.forecast_error is not None:
            families["kvcast_forecast_error"].add_metric([], float(shadow.forecast_error))

    @staticmethod
    def _classifier(classifier: dict[str, Any] | None, families: dict[str, Any]) -> None:
        if classifier is None:
            return
        latency = classifier["latency"]
        families["kvcast_classifier_latency_seconds"].add_metric(
            [], buckets=_buckets(latency), sum_value=latency["sum"]
        )
        worker = classifier["worker"]
        for reason in ("rejected", "timed_out", "expired", "failed"):
            families["kvcast_classifier_fallbacks"].add_metric(
                [reason], float(worker.get(reason, 0))
            )


def _buckets(latency: dict[str, Any]) -> list[tuple[str, float]]:
    """A LatencyHistogram snapshot as Prometheus buckets (upper bound text, cumulative count)."""
    return [
        ("+Inf" if bound == float("inf") else repr(bound), float(count))
        for bound, count in latency["buckets"]
    ]


def build_registry(view: Callable[[], MetricsView]) -> CollectorRegistry:
    """A fresh registry (never the global default one): kvcast's collector and this process's
    ``process_*`` metrics (resident memory, CPU seconds, open files: what an SRE alerts on;
    the serving process's own, not the workers')."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KvcastCollector(view))
    ProcessCollector(registry=registry)
    return registry
