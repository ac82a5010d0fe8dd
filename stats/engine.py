"""The statistics engine: validated events in, snapshots out (SPEC sections 2-3).

Combines the conversation tracker, the completed-conversation window and the arrival
counters. Pure and deterministic: the same events in any order within the allowed lateness
give the same snapshot once the input is finished.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from kvcast.stats.arrivals import ArrivalStats
from kvcast.stats.config import StatsConfig
from kvcast.stats.conversations import ConversationTracker, Outcome
from kvcast.stats.events import Event
from kvcast.stats.snapshot import Snapshot, take_snapshot
from kvcast.stats.window import Bucket, StatsWindow

# Window expiry runs after this many completions (its cost is per bucket, not per event).
EXPIRE_EVERY_COMPLETIONS = 1024
# Rejections kept with their position (the native engine keeps as many: _replay.c).
REJECTIONS_KEPT = 100
# The field at fault in the rejections the engine itself decides (the rest come from parsing).
OUTCOME_FIELDS = {"too_late": "timestamp", "future": "timestamp", "open_limit": "session_id"}


class Rejection(NamedTuple):
    """Where an event was rejected and why: its position (a file's payload index, a Kafka
    offset), the reason, and the field at fault (None: the payload as a whole)."""

    position: int
    reason: str
    field: str | None


def keep_rejection(
    kept: list[Rejection],
    position: int,
    reason: str,
    field: str | None,
    limit: int = REJECTIONS_KEPT,
) -> None:
    """Append to ``kept`` while it holds fewer than ``limit``."""
    if len(kept) < limit:
        kept.append(Rejection(position, reason, field))


@dataclass
class EventCounters:
    """What happened to the events offered: processed (accepted), rejected by reason, duplicates."""

    processed: int = 0
    duplicates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, object]:
        return {
            "processed": self.processed,
            "rejected": sum(self.rejected.values()),
            "rejected_by_reason": dict(sorted(self.rejected.items())),
            "duplicates": self.duplicates,
        }


def apply_event(
    tracker: ConversationTracker,
    window: StatsWindow,
    arrivals: ArrivalStats,
    counters: EventCounters,
    event: Event,
    intent: str,
) -> tuple[Outcome, int]:
    """The apply step of every engine: ``tracker`` observes ``event``, ``counters`` count its
    outcome, an accepted event's arrival goes to ``arrivals`` and the conversations it completed
    to ``window``. Returns the outcome and how many conversations completed."""
    outcome, completed = tracker.observe(event, intent)
    if outcome == "accepted":
        counters.processed += 1
        arrivals.observe(event, tracker.restarted)
    elif outcome == "duplicate":
        counters.duplicates += 1
    else:
        counters.rejected[outcome] += 1
    for conversation in completed:
        window.add(conversation)
    return outcome, len(completed)


class StatsEngine:
    """Tracks conversations and keeps the rolling statistics of one instance."""

    def __init__(self, config: StatsConfig, *, clock_s: float | None = None) -> None:
        """``clock_s``: wall-clock time (s) the ``future`` bound counts from; default now."""
        self.config = config
        self.tracker = ConversationTracker(config, clock_s=clock_s)
        self.window = StatsWindow(config)
        self.arrivals = ArrivalStats(config.rate_window_s)
        self.counters = EventCounters()
        self.rejections: list[Rejection] = []  # the first REJECTIONS_KEPT, in input order
        self._completions_since_expiry = 0

    @classmethod
    def finished(
        cls,
        config: StatsConfig,
        *,
        buckets: dict[int, Bucket],
        arrivals: ArrivalStats,
        counters: EventCounters,
        newest_ts: float,
    ) -> StatsEngine:
        """An engine whose input has ended: no open conversations, the given statistics.

        How another implementation of the same rules (the native replay engine) hands its
        result to the readers of this one (snapshot, counters).
        """
        engine = cls(config)
        engine.tracker = ConversationTracker.restore(config, newest_ts, [], {}, track_changes=False)
        engine.window.buckets = buckets
        engine.arrivals = arrivals
        engine.counters = counters
        return engine

    def apply(self, event: Event, intent: str) -> Outcome:
        """Apply one validated event labelled with ``intent``."""
        outcome, completed = apply_event(
            self.tracker, self.window, self.arrivals, self.counters, event, intent
        )
        self._completions_since_expiry += completed
        if self._completions_since_expiry >= EXPIRE_EVERY_COMPLETIONS:
            self._completions_since_expiry = 0
            self.window.expire(self.tracker.watermark)
        return outcome

    def reject(self, reason: str) -> None:
        """Count an event that failed validation before reaching the engine."""
        self.counters.rejected[reason] += 1

    def note_rejection(self, position: int, reason: str, field: str | None) -> None:
        """Keep where a rejection happened, while fewer than :data:`REJECTIONS_KEPT` are kept."""
        keep_rejection(self.rejections, position, reason, field)

    def finish(self) -> None:
        """End of a finite input: complete every open conversation."""
        for conversation in self.tracker.flush():
            self.window.add(conversation)

    def merge(self, other: StatsEngine) -> None:
        """Add another instance's completed statistics (its open conversations stay its own)."""
        self.window.merge(other.window)
        self.arrivals.merge(other.arrivals)

    def snapshot(self, now_s: float | None = None, *, age_limited: bool = True) -> Snapshot:
        """Statistics of the current window; ``now_s`` defaults to the newest event time.

        ``age_limited=False``: the window holds partitions' windows already cut at their own
        age limits (:func:`~kvcast.stats.window.merge_anchored`)."""
        if now_s is None and self.tracker.newest_event_time > float("-inf"):
            now_s = self.tracker.newest_event_time
        return take_snapshot(
            self.window, self.arrivals, self.config, now_s, age_limited=age_limited
        )
