"""A Redis that answers but refuses writes, or is not there at start: back off, never die.

Against real ``redis-server`` processes: one at ``maxmemory`` with ``noeviction`` (every write
answered ``OOM``), one that is a replica (``READONLY``) until it is promoted, and none at all on
the store's port until one starts there. In each case the daemon keeps running, says why it is
not ready, keeps the last published forecast, retries with backoff, and once the store takes
writes again ends with exactly the statistics of an uninterrupted run. Its log never quotes a
command's arguments (session ids are among them).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kvcast.daemon.publisher import Publisher
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import ReplaySource
from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.lab.bench.processes import OwnRedis, free_port, wait_until
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.replay import Pipeline
from kvcast.stats.snapshot import take_snapshot
from tests.reliability.tally import TALLY
from tests.services import missing

pytestmark = pytest.mark.integration

STATS = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30)
SETTINGS = DaemonSettings(
    stats=STATS,
    commit_interval_s=0.01,
    commit_max_events=97,
    max_uncommitted_events=400,
    refresh_interval_s=0.05,
    table_interval_s=0.01,
    status_interval_s=0.2,
    shutdown_timeout_s=5,
    max_backoff_s=0.4,
)
WAIT_S = 30.0


@pytest.fixture(scope="module")
def lines() -> list[bytes]:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=400, seed=12, prompts=False)
    return [line.rstrip(b"\n") for line in trace.jsonl_lines()]


@pytest.fixture
def redis_dir(tmp_path: Path) -> Path:
    if shutil.which("redis-server") is None:
        missing("redis-server binary", "PATH", "not installed")
    directory = tmp_path / "redis"
    directory.mkdir()
    return directory


class Running:
    """A daemon loop on a thread over ``lines``, with the store at ``url``."""

    def __init__(self, url: str, lines: list[bytes], settings: DaemonSettings = SETTINGS) -> None:
        self.store = RedisStore(url, namespace=f"refusals-{free_port()}", timeout_s=1.0)
        self.source = ReplaySource(lines, partition="p:0")
        self.publisher = Publisher(settings, self.store, self.source.health)
        self.daemon = Daemon(settings, self.store, self.source, self.publisher)
        self.errors: list[BaseException] = []
        self.code: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.code.append(self.daemon.run())
        except BaseException as exc:  # the failure under test: the loop must not raise
            self.errors.append(exc)

    def store_state(self) -> str:
        return self.publisher.published.readiness()[1]["store"]

    def wait_refused(self, error: str) -> None:
        wait_until(lambda: error in self.store_state() or not self.thread.is_alive(), WAIT_S,
                   f"the store to be reported as refusing with {error}")  # fmt: skip
        assert self.thread.is_alive(), f"the daemon loop died: {self.errors!r}"
        ready, components = self.publisher.published.readiness()
        assert not ready and components["store"].startswith("unavailable: redis refused")

    def wait_done(self) -> None:
        wait_until(
            lambda: self.daemon._flushed and not self.daemon._uncommitted(),
            WAIT_S,
            "the daemon to commit everything",
        )
        self.daemon.request_stop()
        self.thread.join(timeout=15)
        assert not self.thread.is_alive() and not self.errors and self.code == [0]

    def finish_and_compare(self, lines: list[bytes]) -> None:
        """Once everything is committed: the stored statistics equal the reference's."""
        self.wait_done()
        differences = self.differences(lines)
        TALLY.add(faults=1, events_compared=len(lines), differences=differences)
        assert differences == 0

    def differences(self, lines: list[bytes]) -> int:
        """States, moments and counters that differ from one uninterrupted offline run."""
        pipeline = Pipeline(STATS)
        pipeline.offer_all(lines)
        pipeline.engine.finish()
        expected = pipeline.engine.snapshot()
        state = self.store.load_window(STATS)
        got = take_snapshot(state.window, state.arrivals, STATS, state.newest_event_time)
        pairs = [
            (got.states, expected.states),
            (got.sample.by_intent, expected.sample.by_intent),
            (state.counters.to_dict(), pipeline.engine.counters.to_dict()),
        ]
        return sum(a != b for a, b in pairs)


def _no_arguments_logged(caplog: pytest.LogCaptureFixture, lines: list[bytes]) -> None:
    text = caplog.text
    assert "of pipeline caused error" not in text and "with args beginning" not in text
    sessions = {line.split(b'"session_id":"', 1)[1].split(b'"', 1)[0].decode() for line in lines}
    assert not [s for s in sessions if s in text]


def test_a_full_redis_backs_the_daemon_off_until_it_takes_writes_again(
    redis_dir: Path, lines: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """maxmemory with noeviction: every commit is refused (OOM, the transaction aborted, nothing
    applied); the loop backs off, /readyz names the refusal, and after maxmemory is raised the
    statistics equal the reference."""
    caplog.set_level(logging.INFO)
    server = OwnRedis(redis_dir, extra=["--maxmemory-policy", "noeviction"])
    try:
        client = server.client()
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + 64 * 1024)  # a few commits, then full
        running = Running(server.url, lines)
        running.wait_refused("OutOfMemoryError")
        time.sleep(1.0)  # refused for a while: still alive, still backing off
        assert running.thread.is_alive()
        client.config_set("maxmemory", 0)
        running.finish_and_compare(lines)
        _no_arguments_logged(caplog, lines)
    finally:
        server.stop()


def test_a_replica_refuses_writes_until_it_is_promoted(
    redis_dir: Path, lines: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """The store URL names a replica (as after a failover that moved the primary): READONLY on
    every commit until ``REPLICAOF NO ONE``; then nothing is lost or counted twice."""
    caplog.set_level(logging.INFO)
    primary_dir, replica_dir = redis_dir / "primary", redis_dir / "replica"
    primary_dir.mkdir()
    replica_dir.mkdir()
    primary = OwnRedis(primary_dir)
    replica = OwnRedis(replica_dir, extra=["--replicaof", "127.0.0.1", str(primary.port)])
    try:
        wait_until(
            lambda: replica.client().info("replication")["master_link_status"] == "up",
            WAIT_S,
            "the replica to sync",
        )
        running = Running(replica.url, lines)
        running.wait_refused("ReadOnlyError")
        replica.client().replicaof("NO", "ONE")
        running.finish_and_compare(lines)
        _no_arguments_logged(caplog, lines)
    finally:
        replica.stop()
        primary.stop()


def test_an_absent_store_is_retried_with_backoff_and_the_log_says_when(
    redis_dir: Path, lines: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens on the store's port at start: partition loads back off like commits
    (doubling to ``max_backoff_s``, jittered), each warning names the wait it keeps; a Redis
    that starts on that port is then used and the statistics equal the reference."""
    caplog.set_level(logging.WARNING, logger="kvcast.daemon.runner")
    server = OwnRedis(redis_dir)
    server.stop()  # the port is known and free: nothing answers there
    settings = replace(SETTINGS, max_backoff_s=1.0)
    running = Running(server.url, lines, settings)
    try:
        time.sleep(4.0)
        warnings = [r for r in caplog.records if "state store unavailable" in r.getMessage()]
        # 0.2 + 0.4 + 0.8 + 1 + 1 ... s at most, half of each at least: 4 to 11 tries in 4 s
        # (every poll tried again before: one each 0.2 s poll timeout, 20 or more).
        assert 2 <= len(warnings) <= 11, [r.getMessage() for r in warnings]
        waits = [
            float(r.getMessage().rsplit("retrying in ", 1)[1].split(" s")[0]) for r in warnings
        ]
        assert all(0.1 <= w <= 1.0 for w in waits)
        assert running.store_state().startswith("unavailable: redis:")
        server.start()
        running.finish_and_compare(lines)
    finally:
        if running.thread.is_alive():
            running.daemon.request_stop()
            running.thread.join(timeout=15)
        server.stop()
