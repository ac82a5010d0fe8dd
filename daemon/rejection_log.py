"""The daemon's log of rejected events: where each one was (partition:offset), why and which
field, rate-limited so that a producer sending garbage cannot flood the log.

Never the payload: a rejected event may carry user text. Every rejection is counted in
``kvcast_events_rejected_total{reason}`` whatever this log leaves out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvcast.stats.engine import Rejection

LINES_PER_WINDOW = 10
WINDOW_S = 60.0


class RejectionLog:
    """At most ``lines`` rejection lines per ``window_s`` seconds; then one line saying how
    many were left out."""

    def __init__(
        self,
        logger: logging.Logger,
        lines: int = LINES_PER_WINDOW,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._lines, self._window_s, self._clock = logger, lines, window_s, clock
        self._window_start = -float("inf")
        self._logged = 0
        self._left_out = 0

    def note(self, partition: str, rejection: Rejection) -> None:
        now = self._clock()
        if now - self._window_start >= self._window_s:
            self._close_window()
            self._window_start, self._logged = now, 0
        if self._logged < self._lines:
            self._logged += 1
            field = f" (field {rejection.field})" if rejection.field else ""
            self._log.warning(
                "rejected event at %s:%d: %s%s",
                partition, rejection.position, rejection.reason, field,
            )  # fmt: skip
        else:
            self._left_out += 1

    def _close_window(self) -> None:
        if self._left_out:
            self._log.warning(
                "%d more rejected events not logged in %.0f s "
                "(kvcast_events_rejected_total counts them all)",
                self._left_out, self._window_s,
            )  # fmt: skip
            self._left_out = 0

    def flush(self) -> None:
        """Say how many were left out since the last line (at shutdown)."""
        self._close_window()
