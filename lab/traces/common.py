"""What every converter shares: record errors that name their line, and the summary."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("mooncake", "bailian", "sharegpt")
"""The trace formats ``kvcast convert --format`` reads."""


class TraceError(ValueError):
    """A bad input record: ``line`` (1-based; for a JSON array, the 1-based item) and why.

    The CLI prefixes the file name, giving ``FILE:LINE: message``.
    """

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass
class ConversionSummary:
    """What a conversion found: requests in and events out, conversations, the turn histogram."""

    format: str
    records: int = 0
    events: int = 0
    conversations: int = 0
    skipped: int = 0
    turns: Counter[int] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def max_turn(self) -> int:
        return max(self.turns, default=0)

    @property
    def multi_turn_conversations(self) -> int:
        """Conversations with at least two turns (those that reached turn 2)."""
        return self.turns.get(2, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "records": self.records,
            "events": self.events,
            "conversations": self.conversations,
            "continuations": self.events - self.conversations,
            "multi_turn_conversations": self.multi_turn_conversations,
            "max_turn": self.max_turn,
            "skipped": self.skipped,
            "turns": {str(k): v for k, v in sorted(self.turns.items())},
            **self.extra,
        }


def need(obj: Any, key: str, line: int, kind: str) -> Any:
    """``obj[key]`` checked against ``kind`` (``int``, ``number``, ``list``, ``id``)."""
    if not isinstance(obj, dict):
        raise TraceError(line, f"expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise TraceError(line, f"missing field {key!r}")
    value = obj[key]
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        "number": isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0,
        "list": isinstance(value, list),
        "id": isinstance(value, (int, str)) and not isinstance(value, bool),
    }[kind]
    if not ok:
        want = {
            "int": "an int >= 0",
            "number": "a finite number >= 0",
            "list": "a list",
            "id": "an int or a string",
        }[kind]
        raise TraceError(line, f"field {key!r} must be {want}, got {value!r:.60}")
    return value


def hash_list(obj: dict[str, Any], key: str, line: int) -> list[int | str]:
    """A list of block ids (ints or strings)."""
    ids = need(obj, key, line, "list")
    for pos, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, (int, str)):
            raise TraceError(line, f"{key}[{pos}] must be an int or a string, got {h!r:.40}")
    return ids
