"""A bound on how long a block of test code may run, for code whose failure is to run forever
(a loop that never ends): the block fails with a clear message instead of hanging the suite.
Main thread only (SIGALRM); the code must return to Python bytecode now and then."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float, what: str = "still running") -> Iterator[None]:
    """Raise AssertionError in the block once ``seconds`` (wall clock) have passed."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"{what} after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
