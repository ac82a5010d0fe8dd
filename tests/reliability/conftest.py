"""Fixtures of the reliability suite, and its summary line.

The summary (faults injected, iterations, hostile inputs, events compared, differences) is
printed at the end of any pytest run that ran one of its tests; see ``tally.py``.
``durable_broker``: a tansu broker whose storage outlives its process, which a test may kill and
start again (``own_redis`` and ``own_broker`` are in the top-level conftest).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.durable_broker import DurableBroker
from tests.reliability.tally import TALLY


def pytest_terminal_summary(terminalreporter) -> None:
    if sum(TALLY.values()):
        terminalreporter.write_sep("-", "reliability summary")
        terminalreporter.write_line(TALLY.line())


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[DurableBroker]:
    directory = tmp_path / "broker"
    directory.mkdir()
    broker = DurableBroker(directory)
    yield broker
    broker.close()
