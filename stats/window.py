"""The statistics window: completed conversations as additive, mergeable, expiring buckets.

Delays are kept as samples (not running sums of logs) because the forecast needs their
empirical distribution anyway, and fits computed from the sorted samples come out bit-identical
whatever order the conversations completed in.

Each completed conversation is folded into the bucket of its last turn's event time
(``bucket_s`` wide). A bucket holds only counts, sums and delay samples, so two daemon
instances' buckets add up (:meth:`Bucket.merge`) and a bucket expires as a whole. The window
read by :meth:`StatsWindow.buckets_in_window` is the newest buckets holding at least
``window_conversations`` conversations, none older than ``window_max_age_s``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from kvcast.stats.config import StatsConfig
from kvcast.stats.conversations import Conversation

StateKey = tuple[str, int]


@dataclass(slots=True)
class StateSums:
    """Per (intent, turn) state: conversations reaching it and those continuing past it."""

    reached: int = 0
    continued: int = 0

    def add(self, other: StateSums) -> None:
        self.reached += other.reached
        self.continued += other.continued


@dataclass(slots=True)
class MomentSums:
    """Per intent: conversations and the workload sums of SPEC section 3 (blocks)."""

    conversations: int = 0
    sum_R: int = 0
    sum_H: int = 0
    sum_H_hash: int = 0
    sum_B: int = 0
    sum_M: int = 0

    def add(self, other: MomentSums) -> None:
        self.conversations += other.conversations
        self.sum_R += other.sum_R
        self.sum_H += other.sum_H
        self.sum_H_hash += other.sum_H_hash
        self.sum_B += other.sum_B
        self.sum_M += other.sum_M


@dataclass(slots=True)
class DelaySample:
    """One inter-turn delay W_t (s) leaving turn t (capped) of ``intent`` with R_t blocks."""

    delay_s: float
    prev_blocks: int
    intent: str
    turn: int


@dataclass(slots=True)
class Bucket:
    """Contributions of the conversations completed in one event-time bucket."""

    conversations: int = 0
    states: dict[StateKey, StateSums] = field(default_factory=dict)
    moments: dict[str, MomentSums] = field(default_factory=dict)
    delays: list[DelaySample] = field(default_factory=list)

    def merge(self, other: Bucket) -> None:
        """Add another bucket's contributions (another instance, or another bucket)."""
        self.conversations += other.conversations
        for key, sums in other.states.items():
            self.states.setdefault(key, StateSums()).add(sums)
        for intent, moments in other.moments.items():
            self.moments.setdefault(intent, MomentSums()).add(moments)
        self.delays.extend(other.delays)

    def add_conversation(self, conversation: Conversation, max_turn: int) -> None:
        """Fold one completed conversation in (SPEC section 3)."""
        intent = conversation.intent
        turns = conversation.sorted_turns()
        first_turn, last_turn = turns[0][0], turns[-1][0]
        for turn in range(first_turn, last_turn + 1):
            sums = self._state(intent, min(turn, max_turn))
            sums.reached += 1
            if turn < last_turn:
                sums.continued += 1
        sum_H = sum_H_hash = 0
        for (turn, record), (next_turn, next_record) in itertools.pairwise(turns):
            sum_H += record.blocks
            sum_H_hash += max(record.blocks - 1, 0)
            if next_turn != turn + 1:
                continue  # a missing turn leaves no measurable delay
            delay_s = max(next_record.timestamp - record.timestamp, 0.0)
            self.delays.append(DelaySample(delay_s, record.blocks, intent, min(turn, max_turn)))
        moments = self.moments.setdefault(intent, MomentSums())
        moments.conversations += 1
        moments.sum_R += sum(record.blocks for _, record in turns)
        moments.sum_H += sum_H
        moments.sum_H_hash += sum_H_hash
        moments.sum_B += turns[-1][1].blocks
        moments.sum_M += last_turn
        self.conversations += 1

    def _state(self, intent: str, turn: int) -> StateSums:
        key = (intent, turn)
        sums = self.states.get(key)
        if sums is None:
            sums = self.states[key] = StateSums()
        return sums


class StatsWindow:
    """Completed-conversation buckets keyed by ``floor(last_ts / bucket_s)``."""

    def __init__(self, config: StatsConfig) -> None:
        self._config = config
        self.buckets: dict[int, Bucket] = {}

    def bucket_index(self, time_s: float) -> int:
        return math.floor(time_s / self._config.bucket_s)

    def add(self, conversation: Conversation) -> None:
        index = self.bucket_index(conversation.last_ts)
        bucket = self.buckets.get(index)
        if bucket is None:
            bucket = self.buckets[index] = Bucket()
        bucket.add_conversation(conversation, self._config.max_turn)

    def merge(self, other: StatsWindow) -> None:
        """Add another window's buckets (e.g. another instance's partitions)."""
        for index, bucket in other.buckets.items():
            self.buckets.setdefault(index, Bucket()).merge(bucket)

    def buckets_in_window(self, now_s: float | None = None) -> list[Bucket]:
        """Newest buckets until ``window_conversations`` are covered, within the max age.

        ``now_s`` (event time) anchors the age limit; by default the newest bucket's end.
        """
        if not self.buckets:
            return []
        indices = sorted(self.buckets, reverse=True)
        if now_s is None:
            now_s = (indices[0] + 1) * self._config.bucket_s
        oldest_allowed = now_s - self._config.window_max_age_s
        chosen: list[Bucket] = []
        covered = 0
        for index in indices:
            if (index + 1) * self._config.bucket_s <= oldest_allowed:
                break
            chosen.append(self.buckets[index])
            covered += self.buckets[index].conversations
            if covered >= self._config.window_conversations:
                break
        return chosen

    def expire(self, now_s: float | None = None) -> int:
        """Drop buckets that can never re-enter the window; return how many were dropped."""
        keep = {id(bucket) for bucket in self.buckets_in_window(now_s)}
        stale = [index for index, bucket in self.buckets.items() if id(bucket) not in keep]
        # Buckets newer than the window's oldest kept one stay (late completions land there).
        if keep:
            oldest_kept = min(i for i, b in self.buckets.items() if id(b) in keep)
            stale = [index for index in stale if index < oldest_kept]
        for index in stale:
            del self.buckets[index]
        return len(stale)
