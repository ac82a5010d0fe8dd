"""The benchmarks' timer: each work's fastest round, the works taken in turn."""

from __future__ import annotations

import time

from kvcast.lab.bench.timing import best_in_turn


def test_works_take_turns_and_each_keeps_its_fastest_round() -> None:
    calls: list[str] = []
    works = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    best = best_in_turn(3, works)
    assert calls == ["a", "b"] * 3
    assert set(best) == {"a", "b"} and all(0.0 <= seconds < 1.0 for seconds in best.values())


def test_a_slow_round_does_not_count() -> None:
    rounds = iter([0.05, 0.0, 0.05])
    best = best_in_turn(3, {"sleepy": lambda: time.sleep(next(rounds))})
    assert best["sleepy"] < 0.04
