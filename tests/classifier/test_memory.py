"""Per-session memory of user messages: the window from prompts, bounds, never persisted."""

from __future__ import annotations

import pickle

import pytest

from kvcast.classifier.memory import SessionMemory
from kvcast.stats.events import Event


def event(session: str, turn: int, ts: float, prompt: str | None = None, **kw: object) -> Event:
    return Event(session, turn, ts, 10, 1, f"{session}-{turn}", prompt=prompt, **kw)  # type: ignore[arg-type]


def test_window_from_remembered_prompts_is_the_last_four() -> None:
    memory = SessionMemory()
    for turn in range(1, 7):
        window = memory.window_for(event("s", turn, float(turn), f"p{turn}"))
    assert window == [(3, "p3"), (4, "p4"), (5, "p5"), (6, "p6")]
    # Other sessions do not leak in.
    assert memory.window_for(event("t", 1, 7.0, "q1")) == [(1, "q1")]


def test_messages_win_over_memory_and_neither_gives_nothing() -> None:
    memory = SessionMemory()
    memory.window_for(event("s", 1, 1.0, "remembered"))
    messages = [{"role": "user", "content": "from messages"}]
    assert memory.window_for(event("s", 2, 2.0, None, messages=messages)) == [(2, "from messages")]
    assert memory.window_for(event("s", 3, 3.0)) == []


def test_memory_is_bounded_in_sessions_turns_chars_and_idle_time() -> None:
    memory = SessionMemory(max_sessions=3, max_chars=5, idle_s=100.0)
    for k in range(5):
        memory.window_for(event(f"s{k}", 1, float(k), "abcdefghij"))
    assert len(memory) == 3 and memory.evicted == 2
    assert memory.window("s4", 1) == [(1, "abcde")]
    memory.window_for(event("late", 1, 1000.0, "x"))
    assert len(memory) == 1  # everything idle for more than 100 s of event time went
    memory.forget("late")
    assert len(memory) == 0


def test_memory_refuses_to_be_pickled() -> None:
    memory = SessionMemory()
    memory.window_for(event("s", 1, 1.0, "secret user text"))
    with pytest.raises(TypeError):
        pickle.dumps(memory)
