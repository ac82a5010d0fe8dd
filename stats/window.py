"""The statistics window: completed conversations as additive, mergeable, expiring buckets.

Delays are kept as samples (not running sums of logs) because the forecast needs their
empirical distribution anyway, and fits computed from the sorted samples come out bit-identical
whatever order the conversations completed in.

A turn's (intent, turn) state takes the conversation's intent (its last turn's: IAC's rule) or
the turn's own, as ``StatsConfig.state_intent`` says (:func:`own_intent_rule`); the workload
moments and each delay's forecast class always take the conversation's.

Each completed conversation is folded into the bucket of its last turn's event time
(``bucket_s`` wide). A bucket holds only counts, sums and delay samples, so two daemon
instances' buckets add up (:meth:`Bucket.merge`) and a bucket expires as a whole. The window
read by :meth:`StatsWindow.buckets_in_window` is the newest buckets holding at least
``window_conversations`` conversations, none older than ``window_max_age_s``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

from kvcast.stats.config import StatsConfig
from kvcast.stats.conversations import Conversation, TurnRecord
from kvcast.stats.taxonomy import AGENT_INTENTS

StateKey = tuple[str, int]
# tuple.__new__ builds a NamedTuple without the Python-level __new__ (half the cost).
_new_tuple = tuple.__new__
_intent_of = attrgetter("intent")
_floor = math.floor


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
    # Shared prefixes (kvcast.stats.shared_prefix): leading shared blocks over all turns, over
    # the final turns, and blocks that became shared (one per shared block's life).
    sum_S: int = 0
    sum_S_B: int = 0
    shared_born: int = 0

    def add(self, other: MomentSums) -> None:
        self.conversations += other.conversations
        self.sum_R += other.sum_R
        self.sum_H += other.sum_H
        self.sum_H_hash += other.sum_H_hash
        self.sum_B += other.sum_B
        self.sum_M += other.sum_M
        self.sum_S += other.sum_S
        self.sum_S_B += other.sum_S_B
        self.shared_born += other.shared_born


@dataclass(frozen=True, slots=True)
class OwnIntentRule:
    """Which turn labels file their state under themselves: those in ``labels``, or every
    one (``every``). Called on a label, says whether it does."""

    labels: frozenset[str] = frozenset()
    every: bool = False

    def __call__(self, label: str) -> bool:
        return self.every or label in self.labels

    def any_in(self, turns: Iterable[TurnRecord]) -> bool:
        """Whether some of these turns' labels file their own state (C-level iteration: this
        runs once per completed conversation)."""
        return self.every or (
            bool(self.labels) and not self.labels.isdisjoint(map(_intent_of, turns))
        )


def own_intent_rule(mode: str) -> OwnIntentRule:
    """``StatsConfig.state_intent`` as a rule on a turn's label: ``conversation`` (never its
    own), ``turn`` (always), ``auto`` (the labels describing one response: the agent endings)."""
    if mode == "conversation":
        return OwnIntentRule()
    if mode == "turn":
        return OwnIntentRule(every=True)
    if mode == "auto":
        return OwnIntentRule(frozenset(AGENT_INTENTS))
    raise ValueError(f"state_intent must be auto, conversation or turn, got {mode!r}")


class DelaySample(NamedTuple):
    """One inter-turn delay W_t (s) leaving turn t (capped) with R_t blocks, of a conversation
    of ``intent``; ``state_intent`` is the intent of the state (``state_intent``, turn) it
    leaves, the conversation's or turn t's own (module docstring).

    A tuple of atoms, so that the garbage collector stops tracking the window's samples.
    """

    delay_s: float
    prev_blocks: int
    intent: str
    turn: int
    # Of prev_blocks, the leading ones the revisit (turn t+1) finds shared with other
    # conversations: their reuse is counted as shared-block references, not as the revisit's.
    prev_shared: int
    state_intent: str


def delay_from_row(row: list | tuple) -> DelaySample:  # type: ignore[type-arg]
    """A stored delay row ``[delay_s, prev_blocks, intent, turn(, prev_shared(, state_intent))]``
    (the short forms: no shared blocks; the state under the conversation's intent)."""
    if len(row) == 6:
        return _new_tuple(DelaySample, row)
    delay_s, prev_blocks, intent, turn, *rest = row
    return _new_tuple(
        DelaySample, (delay_s, prev_blocks, intent, turn, rest[0] if rest else 0, intent)
    )


def gaps_from_stored(stored: list) -> list[float | int]:  # type: ignore[type-arg]
    """Stored shared-block gaps as flat ``[gap_s, blocks, ...]`` (the form written now),
    also from the ``[[gap_s, blocks], ...]`` pairs an earlier daemon wrote (checkpoints and
    buckets still in the store after an upgrade)."""
    if stored and isinstance(stored[0], list):
        return [value for gap_s, blocks in stored for value in (float(gap_s), int(blocks))]
    if len(stored) % 2:
        raise ValueError(f"shared gaps: {len(stored)} values, not (gap_s, blocks) pairs")
    return [float(value) if i % 2 == 0 else int(value) for i, value in enumerate(stored)]


@dataclass(slots=True)
class Bucket:
    """Contributions of the conversations completed in one event-time bucket."""

    conversations: int = 0
    states: dict[StateKey, StateSums] = field(default_factory=dict)
    moments: dict[str, MomentSums] = field(default_factory=dict)
    delays: list[DelaySample] = field(default_factory=list)
    # Flat (gap_s, blocks, gap_s, blocks, ...): ``blocks`` shared blocks referenced again
    # ``gap_s`` seconds after their previous reference (by any conversation); the turns'
    # SharedGaps one after another.
    shared_gaps: list[float | int] = field(default_factory=list)

    def merge(self, other: Bucket) -> None:
        """Add another bucket's contributions (another instance, or another bucket)."""
        self.conversations += other.conversations
        for key, sums in other.states.items():
            self.states.setdefault(key, StateSums()).add(sums)
        for intent, moments in other.moments.items():
            self.moments.setdefault(intent, MomentSums()).add(moments)
        self.delays.extend(other.delays)
        self.shared_gaps.extend(other.shared_gaps)

    def add_conversation(
        self, conversation: Conversation, max_turn: int, own_intent: OwnIntentRule
    ) -> None:
        """Fold one completed conversation in (SPEC section 3).

        One pass over the turns in order; states are created in turn order, so the bucket's
        layout does not depend on how the work is split. A turn whose label ``own_intent``
        accepts files its state under that label, the others under the conversation's intent;
        a turn missing from the conversation takes the state intent of the turn before it.
        """
        turns = conversation.turns
        order = sorted(turns)
        last_turn = order[-1]
        last = turns[last_turn]
        intent = last.intent  # IAC: the most recent intent is the conversation's
        # Most conversations have no turn that files its own state: then every state takes the
        # conversation's intent and no turn is looked up (checked in C: this is the hot path).
        state_intents = (
            {turn: r.intent if own_intent(r.intent) else intent for turn, r in turns.items()}
            if own_intent.any_in(turns.values())
            else None
        )
        states = self.states
        current = intent
        for turn in range(order[0], last_turn + 1):
            if state_intents is not None:
                current = state_intents.get(turn, current)
            key = (current, turn if turn < max_turn else max_turn)
            sums = states.get(key)
            if sums is None:
                sums = states[key] = StateSums()
            sums.reached += 1
            if turn < last_turn:
                sums.continued += 1
        sum_H = sum_H_hash = 0
        delays = self.delays
        shared_gaps = self.shared_gaps
        previous_turn = order[0]
        previous = turns[previous_turn]
        # The shared blocks' sums and gaps, in turn order, in the same pass as the delays.
        sum_S = previous.shared_blocks
        shared_born = 0
        if sum_S:
            shared_born = previous.shared_born
            shared_gaps.extend(previous.shared_gaps)
        for turn in order[1:]:
            record = turns[turn]
            shared = record.shared_blocks
            if shared:
                sum_S += shared
                shared_born += record.shared_born
                shared_gaps.extend(record.shared_gaps)
            blocks = previous.blocks
            sum_H += blocks
            if blocks > 1:
                sum_H_hash += blocks - 1
            if turn == previous_turn + 1:  # a missing turn leaves no measurable delay
                delay_s = record.timestamp - previous.timestamp
                delays.append(
                    _new_tuple(
                        DelaySample,
                        (
                            delay_s if delay_s >= 0.0 else 0.0,
                            blocks,
                            intent,
                            previous_turn if previous_turn < max_turn else max_turn,
                            shared if shared < blocks else blocks,
                            intent if state_intents is None else state_intents[previous_turn],
                        ),
                    )
                )
            previous_turn, previous = turn, record
        moments = self.moments.get(intent)
        if moments is None:
            moments = self.moments[intent] = MomentSums()
        moments.conversations += 1
        moments.sum_R += sum_H + last.blocks
        moments.sum_H += sum_H
        moments.sum_H_hash += sum_H_hash
        moments.sum_B += last.blocks
        moments.sum_M += last_turn
        if sum_S:
            moments.sum_S += sum_S
            moments.sum_S_B += last.shared_blocks
            moments.shared_born += shared_born
        self.conversations += 1


class StatsWindow:
    """Completed-conversation buckets keyed by ``floor(last_ts / bucket_s)``."""

    def __init__(self, config: StatsConfig) -> None:
        self._config = config
        self._own_intent = own_intent_rule(config.state_intent)
        self.buckets: dict[int, Bucket] = {}

    def bucket_index(self, time_s: float) -> int:
        return math.floor(time_s / self._config.bucket_s)

    def add(self, conversation: Conversation) -> None:
        index = _floor(conversation.last_ts / self._config.bucket_s)
        bucket = self.buckets.get(index)
        if bucket is None:
            bucket = self.buckets[index] = Bucket()
        bucket.add_conversation(conversation, self._config.max_turn, self._own_intent)

    def merge(self, other: StatsWindow) -> None:
        """Add another window's buckets (e.g. another instance's partitions)."""
        for index, bucket in other.buckets.items():
            self.buckets.setdefault(index, Bucket()).merge(bucket)

    def buckets_in_window(
        self, now_s: float | None = None, *, age_limited: bool = True
    ) -> list[Bucket]:
        """Newest buckets until ``window_conversations`` are covered, within the max age.

        ``now_s`` (event time) anchors the age limit; by default the newest bucket's end.
        ``age_limited=False``: no age limit here, because the buckets were already cut at
        their partitions' own (:func:`merge_anchored`).
        """
        if not self.buckets:
            return []
        indices = sorted(self.buckets, reverse=True)
        if now_s is None:
            now_s = (indices[0] + 1) * self._config.bucket_s
        oldest_allowed = now_s - self._config.window_max_age_s if age_limited else -math.inf
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


def merge_anchored(
    partitions: Iterable[tuple[StatsWindow, float]], config: StatsConfig
) -> StatsWindow:
    """Partitions' windows ``(window, its newest event time s)`` merged, each cut at its own
    age limit, so that one partition's clock never ages another's conversations out (a
    producer whose clock runs ahead moves only its own partitions' windows). Read the result
    with ``age_limited=False``: the count limit (``window_conversations``) applies to the merge.
    """
    merged = StatsWindow(config)
    for window, newest_s in partitions:
        # No event yet (-inf): nothing to anchor an age limit at, every bucket stays.
        oldest_allowed = newest_s - config.window_max_age_s if math.isfinite(newest_s) else None
        for index, bucket in window.buckets.items():
            if oldest_allowed is None or (index + 1) * config.bucket_s > oldest_allowed:
                merged.buckets.setdefault(index, Bucket()).merge(bucket)
    return merged
