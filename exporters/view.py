"""The typed view the Prometheus collector and the status line read: one consistent copy.

The daemon builds one per scrape (``kvcast.daemon.published.PublishedState.metrics_view``); a
worker process of ``--workers N`` sends its own to the primary, which adds them up. Standard
library only at import time, so that it pickles between processes and imports nothing heavy
(the document types are for annotations; a worker's view carries no documents).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcast.stats.documents import ForecastDocument, TableDocument

# A LatencyHistogram snapshot: {"buckets": [(upper bound s, cumulative count)], "sum": s,
# "count": n}.
Histogram = dict[str, Any]


@dataclass(frozen=True)
class MetricsView:
    """What one process publishes. Times in seconds; counts in events unless stated.

    ``forecast`` and ``table`` are the published documents, typed (None until the first
    refresh);
    ``counters`` the shared event counters (``processed``, ``duplicates``, ``rejected``,
    ``rejected_by_reason``); ``components`` each component's state (``"ok"`` or why not);
    ``store_latency`` a histogram per store operation; ``classifier`` its latency histogram
    and worker counters, None without a classifier.
    """

    forecast: ForecastDocument | None = None
    table: TableDocument | None = None
    counters: dict[str, Any] = field(default_factory=dict)
    commits: int = 0
    lag: int | None = None
    refresh_seconds: float = 0.0
    components: dict[str, str] = field(default_factory=dict)
    store_latency: dict[str, Histogram] = field(default_factory=dict)
    classifier: dict[str, Any] | None = None
    # --engine-metrics: [{"engine": URL, "model", "hit_ratio"}], the same per cache tier
    # [{"engine": URL, "model", "tier", "hit_ratio"}] (shares of the input, 0-1), each URL's
    # state and the failed scrapes so far, [{"engine": URL, "reason", "count"}]
    engines: list[dict[str, Any]] = field(default_factory=list)
    engine_tiers: list[dict[str, Any]] = field(default_factory=list)
    engine_states: dict[str, str] = field(default_factory=dict)
    engine_scrape_errors: list[dict[str, Any]] = field(default_factory=list)
