"""Timing for the benchmarks that compare a figure with a baseline measured in the same run."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_in_turn(rounds: int, works: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Fastest timing (seconds) of each work, the works taken in turn each round, so that a
    machine whose speed drifts during the run (a shared VM) biases none of the ratios."""
    best = dict.fromkeys(works, float("inf"))
    for _ in range(rounds):
        for name, work in works.items():
            started = time.perf_counter()
            work()
            best[name] = min(best[name], time.perf_counter() - started)
    return best
