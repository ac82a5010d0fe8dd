"""The classifier inside the daemon: one batch per consumer poll, within a latency budget.

Events that carry an ``intent`` keep it; the others are classified together, one batch per
poll, through the batched worker (``kvcast.classifier.worker``). Whatever is not answered
within ``budget_s`` of the poll gets ``unknown`` (counted), so the consumer is never held up for
longer than the budget. The per-session memory of recent prompts lives only in this process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from kvcast.daemon.latency import LatencyHistogram
from kvcast.stats.events import Event

log = logging.getLogger(__name__)


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
        """The ``classifier`` entry of the publisher's metrics view."""
        return {
            "classifier": {
                "latency": self.histogram.snapshot(),
                "worker": self.worker.stats.to_dict(),
            }
        }

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
