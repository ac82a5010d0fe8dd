"""What the reliability suite tried, summed over the session and printed at its end.

Tests add to :data:`TALLY` (``TALLY.add(faults=1, iterations=5)``); the hook in ``conftest.py``
prints one line after the run, e.g.::

    reliability: 14 faults injected, 9 iterations, 2391 hostile inputs, 31021 events compared,
    0 differences
"""

from __future__ import annotations

from collections import Counter

FIELDS = ("faults", "iterations", "hostile_inputs", "events_compared", "differences")


class Tally(Counter):
    def add(self, **counts: int) -> None:
        unknown = set(counts) - set(FIELDS)
        if unknown:
            raise KeyError(f"unknown tally fields {sorted(unknown)}")
        self.update(counts)

    def line(self) -> str:
        return (
            f"reliability: {self['faults']} faults injected, {self['iterations']} iterations, "
            f"{self['hostile_inputs']} hostile inputs, {self['events_compared']} events compared, "
            f"{self['differences']} differences"
        )


TALLY = Tally()
