"""Event-time conversation tracking: open conversations, watermark, completion, duplicates.

Ordering rules (they make the result independent of arrival order within the lateness):

- The watermark is the newest accepted event time minus ``allowed_lateness_s``. An event older
  than the watermark is ``too_late`` and changes nothing.
- An event more than ``max_future_skew_s`` ahead of the later of the newest accepted event time
  and the clock (wall-clock seconds, given by the caller) is ``future`` and changes nothing: a
  timestamp in milliseconds, or a producer whose clock runs hours ahead, must not move the
  watermark past every open conversation. The clock counts so that a quiet spell longer than
  the skew is not mistaken for a jump: after it, event time and the clock have moved together.
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
import time
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from kvcast.stats.config import StatsConfig
from kvcast.stats.events import Event
from kvcast.stats.shared_prefix import (
    MIN_DENSE_BLOCKS,
    BlockId,
    SharedGaps,
    SharedPrefixIndex,
)

Outcome = Literal["accepted", "duplicate", "too_late", "future", "open_limit"]

_floor = math.floor
# tuple.__new__ builds a NamedTuple without the Python-level __new__ (half the cost).
_new_tuple = tuple.__new__


class TurnRecord(NamedTuple):
    """One turn of a conversation: arrival (s), input blocks, intent label, shared prefix.

    ``blocks`` is R = ceil(input_tokens / block_size); the first ``shared_blocks`` of them are
    shared with other conversations (``kvcast.stats.shared_prefix``), ``shared_gaps`` are those
    blocks' (gap s, blocks) since their previous reference, ``shared_born`` how many of them
    became shared with this turn.

    An immutable tuple of atoms: the garbage collector stops tracking it, which matters with
    millions of open turns (a slotted class would be walked by every full collection).
    """

    timestamp: float
    blocks: int
    input_tokens: int
    intent: str
    shared_blocks: int = 0
    shared_gaps: SharedGaps = ()
    shared_born: int = 0


@dataclass(slots=True)
class Conversation:
    """A conversation being tracked (or just completed). ``turns`` maps turn index -> record."""

    session_id: str
    turns: dict[int, TurnRecord] = field(default_factory=dict)
    last_ts: float = -math.inf
    held: tuple[BlockId, ...] = ()  # its private blocks in the shared-prefix index

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
    """Keys filed under whole seconds of event time, handed back once a second has passed.

    ``next_due`` is the earliest time at which :meth:`pop_before` has something to hand back
    (the oldest second + 1; inf when empty), so callers skip the call on most events.
    """

    __slots__ = ("_buckets", "_order", "next_due")

    def __init__(self) -> None:
        self._buckets: dict[int, list[str]] = {}
        self._order: list[int] = []
        self.next_due = math.inf

    def add(self, second: int, key: str) -> None:
        bucket = self._buckets.get(second)
        if bucket is None:
            self._buckets[second] = bucket = []
            heapq.heappush(self._order, second)
            if second + 1 < self.next_due:
                self.next_due = second + 1
        bucket.append(key)

    def pop_before(self, time_s: float) -> list[tuple[int, list[str]]]:
        """Hand back and forget every bucket whose whole second lies before ``time_s``."""
        popped = []
        order = self._order
        while order and order[0] + 1 <= time_s:
            second = heapq.heappop(order)
            popped.append((second, self._buckets.pop(second)))
        self.next_due = order[0] + 1 if order else math.inf
        return popped

    def pop_all(self) -> list[tuple[int, list[str]]]:
        return self.pop_before(math.inf)


def shared_index_for(config: StatsConfig) -> SharedPrefixIndex:
    """The shared-prefix index a tracker of ``config`` keeps (off at ``shared_index_blocks``
    0): at most ``shared_index_blocks`` ids, a shared one forgotten ``completion_timeout_s``
    after its last reference, every id of a request's first 2 x ``shared_index_dense_tokens``
    tokens indexed (at least ``MIN_DENSE_BLOCKS`` blocks' worth), fewer beyond."""
    return SharedPrefixIndex(
        config.shared_index_blocks,
        config.completion_timeout_s,
        max(MIN_DENSE_BLOCKS, config.shared_index_dense_tokens // config.block_size),
    )


class ConversationTracker:
    """Groups accepted events into conversations and hands out the completed ones."""

    def __init__(
        self, config: StatsConfig, *, track_changes: bool = False, clock_s: float | None = None
    ) -> None:
        """``clock_s``: wall-clock time (s) for the ``future`` bound; default: now."""
        self._config = config
        self._open: dict[str, Conversation] = {}
        self._deadlines = _SecondBuckets()
        self._seen_ids: dict[str, float] = {}
        self._id_expiry = _SecondBuckets()
        self._newest_ts = -math.inf
        self.changes: TrackerChanges | None = TrackerChanges() if track_changes else None
        # Whether the last accepted event started its conversation anew (a new context, see
        # observe): a conversation start for the arrival rate, as a turn 1 is.
        self.restarted = False
        # Hot-path copies of the (frozen) configuration.
        self._lateness = config.allowed_lateness_s
        self._timeout = config.completion_timeout_s
        self._block_size = config.block_size
        self._max_open = config.max_open_conversations
        self._skew = config.max_future_skew_s
        self._clock = time.time() if clock_s is None else clock_s
        self._future_bound = self._clock + self._skew
        self.shared_index = shared_index_for(config)

    @classmethod
    def restore(
        cls,
        config: StatsConfig,
        newest_ts: float,
        conversations: list[Conversation],
        seen_ids: dict[str, float],
        *,
        shared_blocks: dict[BlockId, float] | None = None,
        track_changes: bool = True,
        clock_s: float | None = None,
    ) -> ConversationTracker:
        """Rebuild a tracker from a checkpoint (its open conversations, remembered ids and
        shared-block table)."""
        tracker = cls(config, track_changes=track_changes, clock_s=clock_s)
        tracker._newest_ts = newest_ts
        tracker._future_bound = max(newest_ts, tracker._clock) + tracker._skew
        timeout = config.completion_timeout_s
        for conversation in conversations:
            tracker._open[conversation.session_id] = conversation
            tracker._deadlines.add(
                math.floor(conversation.last_ts + timeout), conversation.session_id
            )
        for request_id, timestamp in seen_ids.items():
            tracker._seen_ids[request_id] = timestamp
            tracker._id_expiry.add(math.floor(timestamp), request_id)
        tracker.shared_index.restore(
            shared_blocks or {}, ((c.session_id, c.held) for c in conversations)
        )
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
    def future_bound(self) -> float:
        """Event time (s) above which an event is ``future``."""
        return self._future_bound

    def advance_clock(self, clock_s: float) -> None:
        """Move the wall clock (s) the ``future`` bound counts from; it never goes back."""
        if clock_s > self._clock:
            self._clock = clock_s
            self._future_bound = max(self._newest_ts, clock_s) + self._skew

    @property
    def open_conversations(self) -> int:
        return len(self._open)

    def observe(self, event: Event, intent: str) -> tuple[Outcome, list[Conversation]]:
        """Apply one validated event; return its outcome and the conversations it completed."""
        timestamp = event.timestamp
        request_id = event.request_id
        session_id = event.session_id
        if timestamp < self._newest_ts - self._lateness:
            return "too_late", []
        if timestamp > self._future_bound:
            return "future", []
        seen_ids = self._seen_ids
        if request_id in seen_ids:
            return "duplicate", []
        open_ = self._open
        conversation = open_.get(session_id)
        if conversation is None and len(open_) >= self._max_open:
            return "open_limit", []
        seen_ids[request_id] = timestamp
        self._id_expiry.add(_floor(timestamp), request_id)
        changes = self.changes
        if changes is not None:
            changes.ids_added[request_id] = timestamp
            changes.touched_sessions.add(session_id)

        completed: list[Conversation] = []
        timeout = self._timeout
        if conversation is not None and timestamp > conversation.last_ts + timeout:
            self._release(open_.pop(session_id), completed)
            conversation = None
        input_tokens = event.input_tokens
        blocks = -(-input_tokens // self._block_size)
        hashes = event.block_hashes
        held = None
        restarted = False
        if hashes:
            if conversation is not None:
                # The conversation's own id object: the index compares a block's owner with it,
                # and the same object compares without reading either string.
                session_id = conversation.session_id
            newest = conversation is None or event.turn >= max(conversation.turns)
            if (
                conversation is not None
                and newest
                and not self.shared_index.continues(hashes, conversation.held)
            ):
                # A new context (compacted, edited): the cached chain ends with the turn before,
                # and the new one is a conversation start as a turn 1 is (the arrival rate).
                self._release(open_.pop(session_id), completed)
                conversation = None
                restarted = True
            (shared, gaps, born), held = self.shared_index.observe(
                session_id,
                timestamp,
                hashes,
                conversation.held if conversation is not None else (),
                self._last_seen,
                newest,
            )
            if shared > blocks:
                shared = blocks
            record = _new_tuple(
                TurnRecord, (timestamp, blocks, input_tokens, intent, shared, gaps, born)
            )
        else:
            record = _new_tuple(TurnRecord, (timestamp, blocks, input_tokens, intent, 0, (), 0))
        if conversation is None:
            conversation = open_[session_id] = Conversation(session_id, {event.turn: record})
        else:
            turns = conversation.turns
            previous = turns.get(event.turn)
            if previous is None or (timestamp, input_tokens) < (
                previous.timestamp,
                previous.input_tokens,
            ):
                turns[event.turn] = record
        if held is not None:
            conversation.held = held
        if timestamp > conversation.last_ts:
            conversation.last_ts = timestamp
            self._deadlines.add(_floor(timestamp + timeout), session_id)

        self.restarted = restarted
        if timestamp > self._newest_ts:
            self._newest_ts = timestamp
            # max(newest, clock) + skew: the clock's part is already in the bound.
            if timestamp + self._skew > self._future_bound:
                self._future_bound = timestamp + self._skew
            watermark = timestamp - self._lateness
            if (
                self._id_expiry.next_due <= watermark
                or self._deadlines.next_due <= watermark
                or self.shared_index.next_due <= watermark
            ):
                completed.extend(self._complete_due(watermark))
        return "accepted", completed

    def _last_seen(self, session_id: str) -> float:
        """Newest event time (s) of an open conversation: its blocks' last reference."""
        return self._open[session_id].last_ts

    def _release(self, conversation: Conversation, completed: list[Conversation]) -> None:
        """``conversation`` completed: hand it out and take its blocks out of the index."""
        if conversation.held:
            self.shared_index.release(conversation.session_id, conversation.held)
        completed.append(conversation)

    def flush(self) -> list[Conversation]:
        """End of a finite input: the watermark passes every event; all conversations complete."""
        completed = self._complete_due(math.inf)
        # Every open conversation has a deadline entry, so none should be left; be sure.
        if self.changes is not None:
            self.changes.touched_sessions.update(self._open)
        completed.extend(self._open.values())
        self._open.clear()
        self.shared_index.clear()
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
        timeout = self._timeout
        for second, sessions in self._deadlines.pop_before(watermark):
            for session_id in sessions:
                conversation = self._open.get(session_id)
                # Entries left behind when a conversation's deadline moved later are skipped.
                if (
                    conversation is not None
                    and math.floor(conversation.last_ts + timeout) == second
                ):
                    self._release(self._open.pop(session_id), completed)
                    if changes is not None:
                        changes.touched_sessions.add(session_id)
        self.shared_index.expire(watermark)
        return completed
