"""The classifier inside the daemon: one batch per consumer poll, within a latency budget.

Events that carry an ``intent`` keep it; the others are classified together, one batch per
poll, through the batched worker (``kvcast.classifier.worker``). Whatever is not answered
within ``budget_s`` of the poll gets ``unknown`` (counted), so the consumer is never held up for
longer than the budget. The per-session memory of recent prompts lives only in this process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvcast.daemon.latency import LatencyHistogram
from kvcast.stats.events import Event
from kvcast.stats.taxonomy import UNKNOWN

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


class LazyClassifierStage:
    """``--classifier auto``: the classifier is loaded on the first poll with an event that
    needs it (one without an ``intent``), not at start-up, so a stream whose events all carry
    intents never pays for loading a model (seconds, and its memory). The load runs in the
    consumer loop, once, so every event is labelled as an eager load would label it; if it
    fails, events without an intent count as ``unknown`` (logged once)."""

    def __init__(self, load: Callable[[], ClassifierStage | None]) -> None:
        self._load = load
        self._stage: ClassifierStage | None = None
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    def _ensure(self) -> ClassifierStage | None:
        if not self._loaded:
            self._loaded = True
            started = time.monotonic()
            log.info("an event without an intent: loading the classifier")
            self._stage = self._load()
            if self._stage is not None:
                log.info("classifier loaded in %.1f s", time.monotonic() - started)
        return self._stage

    def classify_batch(self, events: Sequence[Event]) -> list[str]:
        stage = self._ensure()
        return [UNKNOWN] * len(events) if stage is None else stage.classify_batch(events)

    def forget(self, session_id: str) -> None:
        if self._stage is not None:
            self._stage.forget(session_id)

    def metrics(self) -> dict[str, Any]:
        """The classifier's metrics once loaded; nothing before (no classifier has run)."""
        return {} if self._stage is None else self._stage.metrics()

    def close(self) -> None:
        if self._stage is not None:
            self._stage.close()


def open_classifier(
    mode: str,
    budget_s: float,
    backbone: str | None = None,
    head: str | None = None,
    taxonomy: int = 30,
) -> ClassifierStage | LazyClassifierStage | None:
    """The classifier stage for ``mode`` (``off``, ``auto`` or ``on``).

    ``on`` loads it now and fails (RuntimeError) when the classifier extra or a backbone is not
    installed. ``auto`` loads it when the first event without an intent arrives
    (:class:`LazyClassifierStage`), and runs without one (intents ``unknown`` unless events
    carry them) when it cannot be loaded, saying so in the log.
    """
    if mode == "off":
        return None
    if mode == "auto":
        return LazyClassifierStage(lambda: _load(mode, budget_s, backbone, head, taxonomy))
    return _load(mode, budget_s, backbone, head, taxonomy)


def _load(
    mode: str, budget_s: float, backbone: str | None, head: str | None, taxonomy: int
) -> ClassifierStage | None:
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
