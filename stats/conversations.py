"""Event-time conversation tracking: open conversations, watermark, completion, duplicates.

Ordering rules (they make the result independent of arrival order within the lateness):

- The watermark is the newest accepted event time minus ``allowed_lateness_s``. An event older
  than the watermark is ``too_late`` and changes nothing.
- A ``request_id`` seen before (and not yet below the watermark) is a ``duplicate``.
- A conversation completes once the watermark passes ``last_ts + completion_timeout_s``.
  An event of a session whose open conversation has been idle longer than the timeout
  completes that conversation and starts a new one (a resumed session).
- Two events for the same turn of a conversation: the earlier timestamp wins (then the
  smaller input), so a retried request never replaces the original.
- Memory is bounded: with ``max_open_conversations`` conversations open, an event that would
  open another is shed (``open_limit``, counted); events of open conversations still count.

Cost per event is O(1) amortised: completion deadlines and remembered request ids sit in
one-second event-time buckets, and only buckets (not conversations) are ordered.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from kvcast.stats.config import StatsConfig
from kvcast.stats.events import Event

Outcome = Literal["accepted", "duplicate", "too_late", "open_limit"]


@dataclass(slots=True)
class TurnRecord:
    """One turn of a conversation: arrival (s), input blocks, intent label."""

    timestamp: float
    blocks: int
    input_tokens: int
    intent: str


@dataclass(slots=True)
class Conversation:
    """A conversation being tracked (or just completed). ``turns`` maps turn index -> record."""

    session_id: str
    turns: dict[int, TurnRecord] = field(default_factory=dict)
    last_ts: float = -math.inf

    @property
    def intent(self) -> str:
        """IAC assigns the most recent intent (that of the highest turn) to the conversation."""
        return self.turns[max(self.turns)].intent

    def sorted_turns(self) -> list[tuple[int, TurnRecord]]:
        return sorted(self.turns.items())


@dataclass(slots=True)
class TrackerChanges:
    """What changed since the last checkpoint: sessions to rewrite, request ids seen/forgotten."""

    touched_sessions: set[str] = field(default_factory=set)
    ids_added: dict[str, float] = field(default_factory=dict)
    ids_removed: set[str] = field(default_factory=set)

    def forget_id(self, request_id: str) -> None:
        if self.ids_added.pop(request_id, None) is None:
            self.ids_removed.add(request_id)


class _SecondBuckets:
    """Keys filed under whole seconds of event time, handed back once a second has passed."""

    def __init__(self) -> None:
        self._buckets: dict[int, list[str]] = {}
        self._order: list[int] = []

    def add(self, second: int, key: str) -> None:
        bucket = self._buckets.get(second)
        if bucket is None:
            self._buckets[second] = bucket = []
            heapq.heappush(self._order, second)
        bucket.append(key)

    def pop_before(self, time_s: float) -> Iterator[tuple[int, list[str]]]:
        """Yield and forget every bucket whose whole second lies before ``time_s``."""
        while self._order and self._order[0] + 1 <= time_s:
            second = heapq.heappop(self._order)
            yield second, self._buckets.pop(second)

    def pop_all(self) -> Iterator[tuple[int, list[str]]]:
        yield from self.pop_before(math.inf)


class ConversationTracker:
    """Groups accepted events into conversations and hands out the completed ones."""

    def __init__(self, config: StatsConfig, *, track_changes: bool = False) -> None:
        self._config = config
        self._open: dict[str, Conversation] = {}
        self._deadlines = _SecondBuckets()
        self._seen_ids: dict[str, float] = {}
        self._id_expiry = _SecondBuckets()
        self._newest_ts = -math.inf
        self.changes: TrackerChanges | None = TrackerChanges() if track_changes else None

    @classmethod
    def restore(
        cls,
        config: StatsConfig,
        newest_ts: float,
        conversations: list[Conversation],
        seen_ids: dict[str, float],
        *,
        track_changes: bool = True,
    ) -> ConversationTracker:
        """Rebuild a tracker from a checkpoint (its open conversations and remembered ids)."""
        tracker = cls(config, track_changes=track_changes)
        tracker._newest_ts = newest_ts
        timeout = config.completion_timeout_s
        for conversation in conversations:
            tracker._open[conversation.session_id] = conversation
            tracker._deadlines.add(
                math.floor(conversation.last_ts + timeout), conversation.session_id
            )
        for request_id, timestamp in seen_ids.items():
            tracker._seen_ids[request_id] = timestamp
            tracker._id_expiry.add(math.floor(timestamp), request_id)
        return tracker

    def open_items(self) -> dict[str, Conversation]:
        """The open conversations by session id (read-only use)."""
        return self._open

    def seen_ids(self) -> dict[str, float]:
        """Request ids still remembered for duplicate detection -> their event time (s)."""
        return self._seen_ids

    @property
    def watermark(self) -> float:
        """Newest accepted event time minus the allowed lateness (s); -inf before any event."""
        return self._newest_ts - self._config.allowed_lateness_s

    @property
    def newest_event_time(self) -> float:
        return self._newest_ts

    @property
    def open_conversations(self) -> int:
        return len(self._open)

    def observe(self, event: Event, intent: str) -> tuple[Outcome, list[Conversation]]:
        """Apply one validated event; return its outcome and the conversations it completed."""
        if event.timestamp < self.watermark:
            return "too_late", []
        if event.request_id in self._seen_ids:
            return "duplicate", []
        if (
            len(self._open) >= self._config.max_open_conversations
            and event.session_id not in self._open
        ):
            return "open_limit", []
        self._seen_ids[event.request_id] = event.timestamp
        self._id_expiry.add(math.floor(event.timestamp), event.request_id)
        if self.changes is not None:
            self.changes.ids_added[event.request_id] = event.timestamp
            self.changes.touched_sessions.add(event.session_id)

        completed: list[Conversation] = []
        timeout = self._config.completion_timeout_s
        conversation = self._open.get(event.session_id)
        if conversation is not None and event.timestamp > conversation.last_ts + timeout:
            completed.append(self._open.pop(event.session_id))
            conversation = None
        if conversation is None:
            conversation = self._open[event.session_id] = Conversation(event.session_id)
        record = TurnRecord(
            timestamp=event.timestamp,
            blocks=-(-event.input_tokens // self._config.block_size),
            input_tokens=event.input_tokens,
            intent=intent,
        )
        previous = conversation.turns.get(event.turn)
        if previous is None or (record.timestamp, record.input_tokens) < (
            previous.timestamp,
            previous.input_tokens,
        ):
            conversation.turns[event.turn] = record
        if event.timestamp > conversation.last_ts:
            conversation.last_ts = event.timestamp
            self._deadlines.add(math.floor(event.timestamp + timeout), event.session_id)

        if event.timestamp > self._newest_ts:
            self._newest_ts = event.timestamp
            completed.extend(self._complete_due(self.watermark))
        return "accepted", completed

    def flush(self) -> list[Conversation]:
        """End of a finite input: the watermark passes every event; all conversations complete."""
        completed = self._complete_due(math.inf)
        # Every open conversation has a deadline entry, so none should be left; be sure.
        if self.changes is not None:
            self.changes.touched_sessions.update(self._open)
        completed.extend(self._open.values())
        self._open.clear()
        self._seen_ids.clear()
        for _ in self._id_expiry.pop_all():
            pass
        return completed

    def _complete_due(self, watermark: float) -> list[Conversation]:
        changes = self.changes
        for _, request_ids in self._id_expiry.pop_before(watermark):
            for request_id in request_ids:
                if self._seen_ids.pop(request_id, None) is not None and changes is not None:
                    changes.forget_id(request_id)
        completed = []
        timeout = self._config.completion_timeout_s
        for second, sessions in self._deadlines.pop_before(watermark):
            for session_id in sessions:
                conversation = self._open.get(session_id)
                # Entries left behind when a conversation's deadline moved later are skipped.
                if (
                    conversation is not None
                    and math.floor(conversation.last_ts + timeout) == second
                ):
                    completed.append(self._open.pop(session_id))
                    if changes is not None:
                        changes.touched_sessions.add(session_id)
        return completed
