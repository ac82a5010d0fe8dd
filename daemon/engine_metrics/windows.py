"""Rolling windows over an engine's cumulative counters: hit ratios and per-tier shares
over the scrapes of the last ``window_s`` seconds."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class HitRatioWindow:
    """Cumulative (hits, queries) of one model on one engine over the scrapes of the last
    ``window_s`` seconds; a counter that went down (an engine restart) starts it anew."""

    window_s: float
    samples: deque[tuple[float, float, float]] = field(default_factory=deque)

    def add(self, at_s: float, hits: float, queries: float) -> None:
        if self.samples and (hits < self.samples[-1][1] or queries < self.samples[-1][2]):
            self.samples.clear()
        self.samples.append((at_s, hits, queries))
        while len(self.samples) > 2 and at_s - self.samples[1][0] >= self.window_s:
            self.samples.popleft()

    def ratio(self) -> float | None:
        """Hits per query over the window; since the engine started with one scrape; None
        without queries."""
        if not self.samples:
            return None
        _at, hits, queries = self.samples[-1]
        if len(self.samples) > 1:
            _first_at, first_hits, first_queries = self.samples[0]
            hits, queries = hits - first_hits, queries - first_queries
        return hits / queries if queries > 0 else None


@dataclass
class TierWindow:
    """Cumulative (input tokens, tokens per tier) of one model on one engine over the scrapes
    of the last ``window_s`` seconds. A tier absent from a sample has served nothing yet (SGLang
    creates a tier's series at its first hit); a count that went down (an engine restart, a tier
    gone) starts the window anew."""

    window_s: float
    samples: deque[tuple[float, float, dict[str, float]]] = field(default_factory=deque)

    def add(self, at_s: float, queries: float, hits: Mapping[str, float]) -> None:
        if self.samples:
            _at, last_queries, last_hits = self.samples[-1]
            if queries < last_queries or any(
                hits.get(tier, 0.0) < count for tier, count in last_hits.items()
            ):
                self.samples.clear()
        self.samples.append((at_s, queries, dict(hits)))
        while len(self.samples) > 2 and at_s - self.samples[1][0] >= self.window_s:
            self.samples.popleft()

    def ratios(self) -> dict[str, float]:
        """Each tier's tokens per input token over the window (since the engine started with
        one scrape); empty without input tokens."""
        if not self.samples:
            return {}
        _at, queries, hits = self.samples[-1]
        first_queries, first_hits = 0.0, {}
        if len(self.samples) > 1:
            _first_at, first_queries, first_hits = self.samples[0]
        served = queries - first_queries
        if served <= 0:
            return {}
        return {tier: (n - first_hits.get(tier, 0.0)) / served for tier, n in hits.items()}
