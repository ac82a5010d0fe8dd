"""The product's statistics of a finite list of events, as the validation reports take them:
one window holding the whole input (no age or count limit; conversations complete only at its
end), computed by the daemon's own engine from the event dicts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import parse_event
from kvcast.stats.sample import WorkloadSample


def whole_input_config(block_size: int) -> StatsConfig:
    """One window over the whole input, ``block_size`` tokens a block."""
    return StatsConfig(
        block_size=block_size,
        completion_timeout_s=1e6,
        rate_window_s=10**9,
        window_conversations=10**9,
        window_max_age_s=1e12,
    )


def sample_from_events(events: Iterable[dict[str, Any]], block_size: int) -> WorkloadSample:
    """The product's statistics from event dicts: one window holding the whole input."""
    engine = StatsEngine(whole_input_config(block_size))
    for raw in events:
        event = parse_event(raw)
        engine.apply(event, event.intent or "unknown")
    engine.finish()
    return engine.snapshot().sample


def steady_sample(
    events: Iterable[dict[str, Any]], block_size: int, start_s: float, end_s: float
) -> WorkloadSample:
    """:func:`sample_from_events`, with lambda0 the conversation starts (sub-agents and
    restarted contexts included, as the daemon counts them) per second in ``[start_s, end_s)``:
    the stationary rate, not the stream's, which the drain after the last arrival dilutes."""
    engine = StatsEngine(whole_input_config(block_size))
    starts = 0
    for raw in events:
        event = parse_event(raw)
        started = engine.apply(event, event.intent or "unknown") == "accepted" and (
            event.turn == 1 or engine.tracker.restarted
        )
        starts += started and start_s <= event.timestamp < end_s
    engine.finish()
    return replace(engine.snapshot().sample, lambda0=starts / (end_s - start_s))
