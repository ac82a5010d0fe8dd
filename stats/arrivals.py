"""Conversation arrival rate (lambda0) and observed hit ratio over the rate window.

Kept as per-second event-time counters (additive, mergeable). The rate window is the
``rate_window_s`` whole seconds ending with the second of the newest conversation start:
``[floor(newest) - rate_window_s + 1, floor(newest)]``. lambda0 is the number of conversation
starts in it (turn-1 events, and later turns that start their conversation anew,
``ConversationTracker.restarted``) divided by ``min(rate_window_s, newest - first)`` seconds,
where ``first``/``newest`` are the earliest/latest starts seen; fewer than two starts (or a
zero span) leave it undefined. The observed hit ratio sums ``cached_tokens`` and
``input_tokens`` of the events that report ``cached_tokens``, over the same seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvcast.stats.events import Event

_floor = math.floor


@dataclass(slots=True)
class SecondCounters:
    starts: int = 0
    cached_tokens: int = 0
    input_tokens: int = 0

    def add(self, other: SecondCounters) -> None:
        self.starts += other.starts
        self.cached_tokens += other.cached_tokens
        self.input_tokens += other.input_tokens


@dataclass
class ArrivalStats:
    """Per-second counters of starts and reported cache hits; see the module docstring."""

    rate_window_s: int
    seconds: dict[int, SecondCounters] = field(default_factory=dict)
    first_start: float = math.inf
    newest_start: float = -math.inf
    start_count: int = 0

    def observe(self, event: Event, restarted: bool = False) -> None:
        """Count one accepted (not duplicate, not late) event; ``restarted``: it started its
        conversation anew at a later turn (a new context), a start as a turn 1 is."""
        cached_tokens = event.cached_tokens
        is_start = event.turn == 1 or restarted
        if not is_start and cached_tokens is None:
            return
        timestamp = event.timestamp
        second = _floor(timestamp)
        counters = self.seconds.get(second)
        if counters is None:
            counters = self.seconds[second] = SecondCounters()
        if is_start:
            counters.starts += 1
            self.start_count += 1
            if timestamp < self.first_start:
                self.first_start = timestamp
            if timestamp > self.newest_start:
                self.newest_start = timestamp
                if len(self.seconds) > 4 * self.rate_window_s:
                    self._prune()
        if cached_tokens is not None:
            counters.cached_tokens += cached_tokens
            counters.input_tokens += event.input_tokens

    def merge(self, other: ArrivalStats) -> None:
        for second, counters in other.seconds.items():
            self._second(second).add(counters)
        self.first_start = min(self.first_start, other.first_start)
        self.newest_start = max(self.newest_start, other.newest_start)
        self.start_count += other.start_count

    def lambda0(self) -> float | None:
        """Conversations per second over the rate window, or None while undefined."""
        span = min(float(self.rate_window_s), self.newest_start - self.first_start)
        if self.start_count < 2 or not span > 0:
            return None
        return self._window_sum("starts") / span

    def observed_hit_ratio(self) -> float | None:
        """sum cached_tokens / sum input_tokens over the rate window, or None without data."""
        if self.newest_start == -math.inf:
            return None
        input_tokens = self._window_sum("input_tokens")
        if input_tokens == 0:
            return None
        return self._window_sum("cached_tokens") / input_tokens

    def _window_sum(self, name: str) -> int:
        last = math.floor(self.newest_start)
        first = last - self.rate_window_s + 1
        if len(self.seconds) <= self.rate_window_s:
            return sum(getattr(c, name) for s, c in self.seconds.items() if first <= s <= last)
        return sum(
            getattr(self.seconds[s], name) for s in range(first, last + 1) if s in self.seconds
        )

    def _second(self, second: int) -> SecondCounters:
        counters = self.seconds.get(second)
        if counters is None:
            counters = self.seconds[second] = SecondCounters()
        return counters

    def _prune(self) -> None:
        """Forget seconds that can no longer enter the rate window (amortised O(1))."""
        first = math.floor(self.newest_start) - self.rate_window_s + 1
        for second in [s for s in self.seconds if s < first]:
            del self.seconds[second]
