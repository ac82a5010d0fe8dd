"""The classifier inside the daemon: one batch per consumer poll, within a latency budget.

Events that carry an ``intent`` keep it; the others are classified together, one batch per
poll, through the batched worker (``kvcast.classifier.worker``). Whatever is not answered
within ``budget_s`` of the poll gets ``unknown`` (counted), so the consumer is never held up for
longer than the budget. The per-session memory of recent prompts lives only in this process.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Sequence
from typing import Any

from kvcast.stats.events import Event

log = logging.getLogger(__name__)

# Upper bounds (s) of the classifier latency histogram's buckets.
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


class ClassifierStage:
    """Labels a poll's events; the ``IntentLabeller.classify_batch`` hook of the pipeline."""

    def __init__(self, worker: Any, histogram: LatencyHistogram) -> None:
        self.worker = worker
        self.histogram = histogram

    def classify_batch(self, events: Sequence[Event]) -> list[str]:
        windows = [self.worker.memory.window_for(event) for event in events]
        return [prediction.intent for prediction in self.worker.classify_many(windows)]

    def forget(self, session_id: str) -> None:
        self.worker.forget(session_id)

    def metrics(self) -> dict[str, Any]:
        return {"latency": self.histogram.snapshot(), "worker": self.worker.stats.to_dict()}

    def close(self) -> None:
        self.worker.close()


def open_classifier(
    mode: str,
    budget_s: float,
    backbone: str | None = None,
    head: str | None = None,
    taxonomy: int = 30,
) -> ClassifierStage | None:
    """The classifier stage for ``mode`` (``off``, ``auto`` or ``on``).

    ``auto`` runs without a classifier (intents ``unknown`` unless events carry them) when the
    classifier extra or a backbone is not installed, saying so in the log; ``on`` fails then.
    """
    if mode == "off":
        return None
    try:
        from kvcast.classifier.model import load_classifier
        from kvcast.classifier.worker import Worker

        classifier = load_classifier(backbone=backbone, head=head, taxonomy=taxonomy)
    except Exception as exc:  # ImportError, BackboneUnavailable, HeadMismatch, OSError
        if mode == "on":
            raise RuntimeError(f"classifier unavailable: {exc}") from exc
        log.warning("classifier unavailable (%s); events without an intent count as unknown", exc)
        return None
    histogram = LatencyHistogram()
    worker = Worker(classifier, budget_s=budget_s, on_latency=histogram.observe).start()
    log.info("classifier ready (budget %.0f ms per poll)", budget_s * 1000)
    return ClassifierStage(worker, histogram)
