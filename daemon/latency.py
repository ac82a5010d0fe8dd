"""A small thread-safe latency histogram (seconds), read by the Prometheus collector."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from typing import Any

# Upper bounds (s) of the latency histograms' buckets.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class LatencyHistogram:
    """Thread-safe cumulative histogram of seconds (the worker thread observes, scrapes read)."""

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
            self._sum += seconds

    def snapshot(self) -> dict[str, Any]:
        """Cumulative bucket counts by upper bound (``+Inf`` last), sum and count."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return {"buckets": cumulative, "sum": total, "count": running}
