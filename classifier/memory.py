"""Per-session memory of recent user messages: bounded, in memory only, never persisted.

When an event carries only the new ``prompt`` (no ``messages``), the classifier's window is
rebuilt from the prompts seen earlier in the same session (SPEC section 2). The memory holds at
most ``turns`` messages for each of at most ``max_sessions`` sessions (least recently used
sessions go first), each cut to ``max_chars`` characters, and drops sessions idle for longer
than ``idle_s`` seconds of event time. It refuses to be pickled, so user text cannot leak into a
checkpoint by accident.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvcast.classifier.inputs import WINDOW_TURNS, Window, window_from_messages
from kvcast.stats.events import Event


@dataclass
class _Session:
    last_seen: float
    turns: dict[int, str] = field(default_factory=dict)


class SessionMemory:
    """The last ``turns`` user messages of each open session, keyed by turn index."""

    def __init__(
        self,
        max_sessions: int = 100_000,
        turns: int = WINDOW_TURNS,
        max_chars: int = 8_192,
        idle_s: float = 1_800.0,
    ) -> None:
        if max_sessions < 1 or turns < 1 or max_chars < 1:
            raise ValueError("max_sessions, turns and max_chars must be >= 1")
        self.max_sessions = max_sessions
        self.turns = turns
        self.max_chars = max_chars
        self.idle_s = idle_s
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._newest = float("-inf")
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __getstate__(self) -> None:
        raise TypeError("SessionMemory holds user text and is never persisted")

    def remember(self, session_id: str, turn: int, text: str, timestamp: float) -> Window:
        """Store one user message; return the session's window ending at ``turn``."""
        session = self._sessions.get(session_id)
        if session is None:
            session = _Session(last_seen=timestamp)
            self._sessions[session_id] = session
        else:
            self._sessions.move_to_end(session_id)
            session.last_seen = max(session.last_seen, timestamp)
        session.turns[turn] = text[: self.max_chars]
        if len(session.turns) > self.turns:
            for old in sorted(session.turns)[: len(session.turns) - self.turns]:
                del session.turns[old]
        self._newest = max(self._newest, timestamp)
        self._expire()
        return self.window(session_id, turn)

    def window(self, session_id: str, turn: int) -> Window:
        """Remembered messages of turns ``turn - turns + 1 .. turn``, oldest first."""
        session = self._sessions.get(session_id)
        if session is None:
            return []
        low = turn - self.turns + 1
        return [(t, session.turns[t]) for t in sorted(session.turns) if low <= t <= turn]

    def forget(self, session_id: str) -> None:
        """Drop a session (call it when its conversation completes)."""
        self._sessions.pop(session_id, None)

    def _expire(self) -> None:
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
            self.evicted += 1
        horizon = self._newest - self.idle_s
        # Least recently *touched* first; event time may be out of order, so stop at the first
        # session that is still fresh rather than scanning everything.
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_seen >= horizon:
                break
            self._sessions.popitem(last=False)
            self.evicted += 1

    def window_for(self, event: Event) -> Window:
        """The classifier window of an event: from ``messages`` when present, else from the
        prompts remembered for its session (this event's prompt included). Empty (so the
        intent is ``unknown``) when the event carries neither."""
        if event.messages:
            return window_from_messages(event.messages, event.turn, self.turns)
        if event.prompt and event.prompt.strip():
            return self.remember(event.session_id, event.turn, event.prompt, event.timestamp)
        return []
