"""Per-partition statistics with checkpoints, for effectively-once processing of a log.

A Kafka partition (or a replay file, as partition ``file:0``) is processed by one
:class:`PartitionEngine`: its own conversation tracker and watermark, so that the statistics
depend only on each partition's event order, never on how partitions are spread over daemon
instances. The engine accumulates a :class:`PartitionDelta` (window contributions, arrival
counters, counters, tracker changes, the last applied offset) that a state store applies
atomically; a restart resumes from the :class:`PartitionCheckpoint` the store hands back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from kvcast.stats.arrivals import ArrivalStats
from kvcast.stats.config import StatsConfig
from kvcast.stats.conversations import Conversation, ConversationTracker, Outcome, TurnRecord
from kvcast.stats.engine import (
    OUTCOME_FIELDS,
    REJECTIONS_KEPT,
    EventCounters,
    Rejection,
    apply_event,
    keep_rejection,
)
from kvcast.stats.events import Event
from kvcast.stats.shared_prefix import BlockId
from kvcast.stats.window import Bucket, StatsWindow, gaps_from_stored


def encode_conversation(conversation: Conversation) -> bytes:
    """Compact JSON of an open conversation (no user text: turns, times, sizes, intents, the
    shared prefix of the turns that had one, and the block ids it holds in the index)."""
    payload: list[Any] = [
        conversation.last_ts,
        [
            [turn, r.timestamp, r.blocks, r.input_tokens, r.intent]
            if not r.shared_blocks
            else [turn, *r[:4], r.shared_blocks, r.shared_gaps, r.shared_born]
            for turn, r in conversation.turns.items()
        ],
    ]
    if conversation.held:
        payload.append(conversation.held)
    return orjson.dumps(payload)


def _turn_record(row: list) -> TurnRecord:
    """A stored turn: ``[turn, ts, blocks, tokens, intent]``, plus ``shared_blocks, gaps,
    born`` when the turn shared a prefix (checkpoints written before 0.3 have five items)."""
    if len(row) == 5:
        return TurnRecord(row[1], row[2], row[3], row[4])
    return TurnRecord(
        row[1], row[2], row[3], row[4], row[5], tuple(gaps_from_stored(row[6])), row[7]
    )


def decode_conversation(session_id: str, payload: bytes) -> Conversation:
    last_ts, turns, *held = orjson.loads(payload)
    return Conversation(
        session_id=session_id,
        turns={row[0]: _turn_record(row) for row in turns},
        last_ts=last_ts,
        held=tuple(held[0]) if held else (),
    )


@dataclass
class PartitionCheckpoint:
    """What a store keeps per partition: the resume point and the tracker's state."""

    offset: int  # last applied offset; -1 before any
    newest_ts: float
    conversations: dict[str, bytes] = field(default_factory=dict)
    seen_ids: dict[str, float] = field(default_factory=dict)
    shared_blocks: dict[BlockId, float] = field(default_factory=dict)  # block -> last use (s)


@dataclass
class PartitionDelta:
    """Everything one commit changes for a partition; stores apply it all or nothing."""

    partition: str
    base_offset: int  # the stored offset this delta builds on (-1: none yet)
    offset: int  # last offset it covers
    newest_ts: float
    upserts: dict[str, bytes]
    removals: list[str]
    ids_added: dict[str, float]
    ids_removed: list[str]
    buckets: dict[int, Bucket]
    arrivals: ArrivalStats
    counters: EventCounters
    shared_upserts: dict[BlockId, float] = field(default_factory=dict)
    shared_removals: list[BlockId] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.shared_upserts
            or self.shared_removals
            or self.upserts
            or self.removals
            or self.ids_added
            or self.ids_removed
            or self.buckets
            or self.arrivals.seconds
            or self.counters.processed
            or self.counters.duplicates
            or self.counters.rejected
        )


class PartitionEngine:
    """One partition's tracker plus the contributions not yet committed."""

    def __init__(
        self,
        config: StatsConfig,
        partition: str,
        checkpoint: PartitionCheckpoint | None = None,
        rejections_kept: int = REJECTIONS_KEPT,
    ) -> None:
        """``rejections_kept``: how many rejections :meth:`take_rejections` keeps between two
        calls (a caller that needs every one takes them at least that often)."""
        self.config = config
        self.partition = partition
        checkpoint = checkpoint or PartitionCheckpoint(offset=-1, newest_ts=-math.inf)
        self.offset = checkpoint.offset
        self.committed_offset = checkpoint.offset
        self.tracker = ConversationTracker.restore(
            config,
            checkpoint.newest_ts,
            [decode_conversation(s, p) for s, p in checkpoint.conversations.items()],
            checkpoint.seen_ids,
            shared_blocks=checkpoint.shared_blocks,
        )
        self._reset_pending()
        # Rejections since the daemon last took them (its log, its dead letters), the first
        # rejections_kept.
        self._rejections: list[Rejection] = []
        self._rejections_kept = rejections_kept

    def take_rejections(self) -> list[Rejection]:
        """The rejections (offsets) since the last call, at most ``rejections_kept``."""
        taken, self._rejections = self._rejections, []
        return taken

    def _reset_pending(self) -> None:
        self._window = StatsWindow(self.config)
        self._arrivals = ArrivalStats(self.config.rate_window_s)
        self._counters = EventCounters()

    @property
    def pending_events(self) -> int:
        """Offsets applied since the last :meth:`take_delta`."""
        return self.offset - self.committed_offset

    def apply(self, event: Event, intent: str, offset: int) -> Outcome:
        """Apply the event found at ``offset`` (offsets must increase)."""
        outcome, _ = apply_event(
            self.tracker, self._window, self._arrivals, self._counters, event, intent
        )
        if outcome not in ("accepted", "duplicate"):  # a rejection the tracker decided
            keep_rejection(
                self._rejections,
                offset,
                outcome,
                OUTCOME_FIELDS.get(outcome),
                self._rejections_kept,
            )
        self.offset = offset
        return outcome

    def reject(self, reason: str, offset: int, field: str | None = None) -> None:
        """Count the payload at ``offset`` that failed validation (``field``: at fault)."""
        self._counters.rejected[reason] += 1
        keep_rejection(self._rejections, offset, reason, field, self._rejections_kept)
        self.offset = offset

    def take_delta(self) -> PartitionDelta:
        """Hand over everything since the last delta and start a new one."""
        changes = self.tracker.changes
        assert changes is not None
        shared = self.tracker.shared_index.changes
        open_conversations = self.tracker.open_items()
        upserts = {}
        removals = []
        for session_id in changes.touched_sessions:
            conversation = open_conversations.get(session_id)
            if conversation is None:
                removals.append(session_id)
            else:
                upserts[session_id] = encode_conversation(conversation)
        delta = PartitionDelta(
            partition=self.partition,
            base_offset=self.committed_offset,
            offset=self.offset,
            newest_ts=self.tracker.newest_event_time,
            upserts=upserts,
            removals=sorted(removals),
            ids_added=dict(changes.ids_added),
            ids_removed=sorted(changes.ids_removed),
            buckets=self._window.buckets,
            arrivals=self._arrivals,
            counters=self._counters,
            shared_upserts=dict(shared.upserts),
            shared_removals=sorted(shared.removals, key=repr),
        )
        shared.clear()
        changes.touched_sessions.clear()
        changes.ids_added.clear()
        changes.ids_removed.clear()
        self._reset_pending()
        self.committed_offset = self.offset
        return delta

    def flush(self) -> None:
        """End of a finite input: complete every open conversation (into the pending delta)."""
        for conversation in self.tracker.flush():
            self._window.add(conversation)
