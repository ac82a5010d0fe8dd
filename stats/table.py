"""The Intent-Aware Caching priority table (SPEC section 5) as a JSON-ready document."""

from __future__ import annotations

from typing import Any

from kvcast.stats.config import StatsConfig
from kvcast.stats.snapshot import Snapshot


def table_document(snapshot: Snapshot, config: StatsConfig, version: int) -> dict[str, Any]:
    """The versioned table: one entry per observed (intent, turn) state, defaults filled in."""
    return {
        "version": version,
        "generated_at": snapshot.generated_at,
        "window_conversations": snapshot.window_conversations,
        # Turns above it share its state: clients cap a node's turn here before looking it up.
        "max_turn": config.max_turn,
        "defaults": {
            "p_continue": config.default_p_continue,
            "median_reuse_s": config.default_median_reuse_s,
        },
        "states": [state.to_dict() for state in snapshot.states],
    }


def table_content_changed(previous: dict[str, Any] | None, current: dict[str, Any]) -> bool:
    """Whether the table's content (everything but version and time stamp) differs."""
    if previous is None:
        return True
    ignore = {"version", "generated_at"}
    return any(previous.get(k) != v for k, v in current.items() if k not in ignore)
