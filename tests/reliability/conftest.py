"""Fixtures of the reliability suite, and its summary line.

The summary (faults injected, iterations, hostile inputs, events compared, differences) is
printed at the end of any pytest run that ran one of its tests; see ``tally.py``.
Own services: ``own_redis`` (a redis-server with an append-only file, so a restart keeps the
state as in production), ``own_broker`` (a tansu broker that a test may freeze) and
``durable_broker`` (a tansu broker whose storage outlives its process, which a test may kill
and start again).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcast.daemon.bench.soak import OwnRedis, free_port, wait_until
from tests.reliability.durable_broker import DurableBroker, listening, tansu_binary
from tests.reliability.tally import TALLY
from tests.services import missing


def pytest_terminal_summary(terminalreporter) -> None:
    if sum(TALLY.values()):
        terminalreporter.write_sep("-", "reliability summary")
        terminalreporter.write_line(TALLY.line())


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None:
        missing("redis-server binary", "PATH", "not installed")
    directory = tmp_path / "redis"
    directory.mkdir()
    server = OwnRedis(directory)
    yield server
    server.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    binary = tansu_binary()
    port = free_port()
    address = f"127.0.0.1:{port}"
    process = subprocess.Popen(
        [str(binary), "broker", "--listener-url", f"tcp://{address}",
         "--advertised-listener-url", f"tcp://{address}", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    wait_until(lambda: listening(port), 10, "the broker to listen")
    yield address, process
    process.kill()
    process.wait()


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[DurableBroker]:
    directory = tmp_path / "broker"
    directory.mkdir()
    broker = DurableBroker(directory)
    yield broker
    broker.close()
