"""Garbage-collector settings for the long-running commands (``run``, ``replay``, ``bench``).

The statistics keep many long-lived containers (open conversations, window buckets, duplicate
ids) and allocate a few short-lived ones per event, almost none of them in reference cycles.
CPython's default first-generation threshold (700 allocations) then runs a collection every
few hundred events that finds nothing. A larger first generation made the replay pipeline
1.13-1.34x faster in same-process A/Bs (docs/performance.md; freezing the start-up objects as
well gained nothing measurable, so it is not done). Cycles are still collected, only less
often: memory stays bounded.

The tap is the opposite case: it holds every open stream's objects (connections, buffers,
headers) for the stream's life, and what it must not do is pause. A full collection scans every
tracked object; with 1,000 streams open it took 40-107 ms, long enough to show in the
first-byte p99 of the streams starting meanwhile (``kvcast bench --suite tap``, 2 cores). The
tap therefore freezes its start-up objects out of the scans and runs full collections ten times
less often, keeping the default young generation (a larger one, as above, made each young
collection scan the streams' objects too: 30-50 ms). Measured the same way, no full collection
ran during the benchmark and the longest event-loop stall fell from 109 ms to 10-30 ms.

Process-wide, so only entry points call these, never library code.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

FIRST_GENERATION = 50_000  # container allocations between young collections (default 700)
OLDER_GENERATIONS = (20, 100)  # young collections per middle one, middle per full (10, 10)
LATENCY_THRESHOLDS = (700, 10, 100)  # the defaults, with full collections 10x rarer


def tune_for_streaming() -> None:
    """Raise the collection thresholds."""
    gc.set_threshold(FIRST_GENERATION, *OLDER_GENERATIONS)


def tune_for_latency() -> None:
    """Freeze what start-up allocated and make full collections rarer (the tap)."""
    gc.freeze()
    gc.set_threshold(*LATENCY_THRESHOLDS)


@contextlib.contextmanager
def latency_tuned() -> Iterator[None]:
    """:func:`tune_for_latency` for a block (a benchmark's client), then the settings before."""
    before = gc.get_threshold()
    tune_for_latency()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
