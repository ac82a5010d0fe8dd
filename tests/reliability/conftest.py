"""Fixtures of the reliability suite.

Its summary line (faults injected, iterations, hostile inputs, events compared, differences)
is printed by the top-level conftest, summed over pytest-xdist's workers; see ``tally.py``.
``durable_broker``: a tansu broker whose storage outlives its process, which a test may kill and
start again (``own_redis`` and ``own_broker`` are in the top-level conftest).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.durable_broker import DurableBroker


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[DurableBroker]:
    directory = tmp_path / "broker"
    directory.mkdir()
    broker = DurableBroker(directory)
    yield broker
    broker.close()
