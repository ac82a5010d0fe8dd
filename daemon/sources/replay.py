"""Finite sources: a JSONL file or the embedded sample workload, as one partition.

``speedup`` paces the replay in accelerated event time: a record is released once
``(its timestamp - first timestamp) / speedup`` seconds of wall time have passed; ``None``
replays as fast as possible. Offsets are line indices, so a replay is a log like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import orjson

from kvcast.daemon.sources.base import PartitionListener, Record, new_record


def _timestamp(line: bytes) -> float | None:
    try:
        value = orjson.loads(line).get("timestamp")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class ReplaySource:
    """Hands out ``lines`` in order as partition ``partition``."""

    def __init__(
        self,
        lines: Sequence[bytes],
        partition: str = "replay:0",
        speedup: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._lines = lines
        self._partition = partition
        self._speedup = speedup
        self._clock = clock
        self._sleep = sleep
        self._next = 0
        self._paused = False
        self._listener: PartitionListener | None = None
        self._assigned = False
        self._started_at: float | None = None
        self._first_ts: float | None = None

    def set_listener(self, listener: PartitionListener) -> None:
        self._listener = listener

    def _due(self, line: bytes) -> bool:
        if self._speedup is None:
            return True
        ts = _timestamp(line)
        if ts is None:
            return True  # a broken line goes straight to validation
        if self._first_ts is None or self._started_at is None:
            self._first_ts, self._started_at = ts, self._clock()
        return (ts - self._first_ts) / self._speedup <= self._clock() - self._started_at

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        if not self._assigned:
            self._assigned = True
            if self._listener is not None:
                self._listener.on_assign([self._partition])
        records: list[Record] = []
        deadline = self._clock() + timeout_s
        while not self._paused and self._next < len(self._lines) and len(records) < max_records:
            line = self._lines[self._next]
            if not self._due(line):
                if records or self._clock() >= deadline:
                    break
                self._sleep(min(0.05, max(deadline - self._clock(), 0.0)))
                continue
            records.append(new_record(self._partition, self._next, line))
            self._next += 1
        if not records and (self._paused or self.finished()):
            self._sleep(min(timeout_s, 0.05))
        return records

    def seek(self, partition: str, offset: int) -> None:
        self._next = max(0, offset)

    def pause(self, partitions: list[str]) -> None:
        if self._partition in partitions:
            self._paused = True

    def resume(self, partitions: list[str]) -> None:
        if self._partition in partitions:
            self._paused = False

    def finished(self) -> bool:
        return self._next >= len(self._lines)

    def health(self) -> tuple[bool, str]:
        return True, "ok"

    def lag(self) -> int | None:
        return len(self._lines) - self._next

    def close(self) -> None:
        return None


# Bytes of a file read at once by read_line_batches (a batch is about this size).
READ_BATCH_BYTES = 4 << 20


def read_line_batches(path: Path, blank_lines: list[int] | None = None) -> Iterable[list[bytes]]:
    """Non-blank lines of a JSONL file, stripped, in lists of about 4 MiB of text.

    ``blank_lines``, when given, gets the 0-based line numbers of the blank lines skipped, so
    that a payload's index can be turned back into its line (:func:`file_line`)."""
    first_line = 0
    with path.open("rb") as handle:
        while batch := handle.readlines(READ_BATCH_BYTES):
            stripped = list(map(bytes.strip, batch))
            if blank_lines is not None:
                blank_lines.extend(first_line + i for i, line in enumerate(stripped) if not line)
            first_line += len(batch)
            yield [line for line in stripped if line]


def file_line(index: int, blank_lines: list[int]) -> int:
    """The 1-based line of the file holding the ``index``-th (0-based) non-blank line."""
    line = index
    for blank in blank_lines:  # sorted: each blank line at or before it moves it one down
        if blank > line:
            break
        line += 1
    return line + 1
