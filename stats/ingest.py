"""The one ingest step: raw payload -> validated event -> intent -> statistics, in order.

The daemon runs it over each poll's records (per-partition targets, Kafka offsets as
positions), the Python replay engine over a file's lines (one target); the native engine
(``kvcast.stats.native``) is specified against it. Ordering rule: payloads are applied in the
order given; the valid payloads between two rejections are labelled together (one classifier
batch) and applied before the rejection that follows them is counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvcast.stats.engine import OUTCOME_FIELDS, StatsEngine
from kvcast.stats.events import Event, EventRejected, parse_event
from kvcast.stats.labeller import IntentLabeller


class IngestTarget(Protocol):
    """Where an ingested payload lands: a partition engine, or a whole-log engine."""

    def apply(self, event: Event, intent: str, position: int) -> object:
        """Count a valid event found at ``position`` (a Kafka offset, a line index)."""

    def reject(self, reason: str, position: int, field: str | None) -> None:
        """Count the payload at ``position`` that failed validation (``field``: at fault)."""


class EngineTarget:
    """A :class:`StatsEngine` (no offsets: a finite log read once) as an ingest target."""

    __slots__ = ("engine",)

    def __init__(self, engine: StatsEngine) -> None:
        self.engine = engine

    def apply(self, event: Event, intent: str, position: int) -> object:
        outcome = self.engine.apply(event, intent)
        field = OUTCOME_FIELDS.get(outcome)
        if field is not None:
            self.engine.note_rejection(position, outcome, field)
        return outcome

    def reject(self, reason: str, position: int, field: str | None) -> None:
        self.engine.reject(reason)
        self.engine.note_rejection(position, reason, field)


def ingest(
    items: Iterable[tuple[IngestTarget, int, bytes | str]], labeller: IntentLabeller
) -> EventRejected | None:
    """Parse, label and apply ``(target, position, payload)`` items; the last rejection."""
    last: EventRejected | None = None
    run: list[tuple[IngestTarget, int, Event]] = []
    for target, position, payload in items:
        try:
            event = parse_event(payload)
        except EventRejected as rejection:
            if run:  # keep positions in order: apply what came before first
                _apply(run, labeller)
                run = []
            target.reject(rejection.reason, position, rejection.field)
            last = rejection
            continue
        run.append((target, position, event))
    if run:
        _apply(run, labeller)
    return last


def _apply(run: list[tuple[IngestTarget, int, Event]], labeller: IntentLabeller) -> None:
    labels = labeller.label_batch([event for _, _, event in run])
    for (target, position, event), label in zip(run, labels, strict=True):
        target.apply(event, label, position)
