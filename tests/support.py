"""Helpers shared by tests: comparable forms of results."""

from __future__ import annotations

from kvcast.stats.snapshot import Snapshot


def canonical(snapshot: Snapshot) -> tuple:
    """Everything a snapshot says, as a tuple that compares exactly (arrays as bytes)."""
    s = snapshot.sample
    return (
        snapshot.states,
        s.intents,
        s.by_intent,
        s.delay_s.tobytes(),
        s.prev_blocks.tobytes(),
        s.intent.tobytes(),
        s.turn.tobytes(),
        s.lambda0,
        s.observed_hit_ratio,
        snapshot.window_conversations,
    )
