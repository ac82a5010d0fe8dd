"""Garbage-collector settings for the long-running commands (``run``, ``replay``, ``bench``).

The statistics keep many long-lived containers (open conversations, window buckets, duplicate
ids) and allocate a few short-lived ones per event, almost none of them in reference cycles.
CPython's default first-generation threshold (700 allocations) then runs a collection every
few hundred events that finds nothing. A larger first generation made the replay pipeline
1.13-1.34x faster in same-process A/Bs (docs/performance.md; freezing the start-up objects as
well gained nothing measurable, so it is not done). Cycles are still collected, only less
often: memory stays bounded.

Process-wide, so only entry points call it, never library code.
"""

from __future__ import annotations

import gc

FIRST_GENERATION = 50_000  # container allocations between young collections (default 700)
OLDER_GENERATIONS = (20, 100)  # young collections per middle one, middle per full (10, 10)


def tune_for_streaming() -> None:
    """Raise the collection thresholds."""
    gc.set_threshold(FIRST_GENERATION, *OLDER_GENERATIONS)
