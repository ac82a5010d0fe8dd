"""``kvcast run --workers N``: one instance of N processes in the consumer group.

The workers split the partitions, their statistics equal the offline reference, one scrape of
the primary covers every process, a worker that dies takes the instance down (exit 1) and the
restart loses nothing, and no process outlives the instance.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from click.testing import CliRunner

from kvcast.cli.commands.run import run
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.workers import merge_views
from kvcast.exporters.view import MetricsView
from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.lab.bench.soak import Producer, compare, wait_consumed
from kvcast.lab.bench.soak import workload as soak_workload
from tests.support import daemon_args, produce

BUCKETS = [(0.001, 1), (0.01, 3), (float("inf"), 4)]


def histogram(counts: list[int], total: float) -> dict:
    return {
        "buckets": [(bound, c) for (bound, _), c in zip(BUCKETS, counts, strict=True)],
        "sum": total,
        "count": counts[-1],
    }


def test_merged_view_adds_counters_lag_histograms_and_fallbacks() -> None:
    primary = MetricsView(
        commits=5,
        lag=10,
        counters={"processed": 100},
        components={"store": "ok", "workers": "ok"},
        store_latency={"commit": histogram([1, 2, 2], 0.25)},
        classifier={
            "latency": histogram([0, 1, 1], 0.125),
            "worker": {"rejected": 1, "timed_out": 0, "device": "cpu"},
        },
    )
    worker = MetricsView(
        commits=7,
        lag=3,
        counters={"processed": 999},  # read from the store by the primary: not added
        components={"store": "unavailable: timeout"},
        store_latency={
            "commit": histogram([0, 1, 3], 0.5),
            "load_partition": histogram([1, 1, 1], 0.0005),
        },
        classifier={
            "latency": histogram([1, 1, 2], 0.0625),
            "worker": {"rejected": 2, "timed_out": 4, "device": "cpu"},
        },
    )
    merged = merge_views(primary, [worker])
    assert merged.commits == 12 and merged.lag == 13
    assert merged.counters == {"processed": 100}
    assert merged.components == {"store": "unavailable: timeout", "workers": "ok"}
    assert merged.store_latency["commit"] == histogram([1, 3, 5], 0.75)
    assert merged.store_latency["load_partition"] == histogram([1, 1, 1], 0.0005)
    assert merged.classifier is not None
    assert merged.classifier["latency"] == histogram([1, 2, 3], 0.1875)
    assert merged.classifier["worker"] == {"rejected": 3, "timed_out": 4, "device": "cpu"}
    assert primary.commits == 5 and primary.components["store"] == "ok"  # not changed


def test_lag_stays_unknown_until_a_process_knows_it() -> None:
    assert merge_views(MetricsView(lag=None), [MetricsView(lag=None)]).lag is None
    assert merge_views(MetricsView(lag=None), [MetricsView(lag=4)]).lag == 4


@pytest.mark.parametrize(
    ("source", "store"),
    [
        (None, "memory://"),
        ("file:///tmp/events.jsonl", "redis://127.0.0.1:6379/0"),
        ("kafka://127.0.0.1:9092/events", "memory://"),
    ],
)
def test_workers_need_kafka_and_redis(source: str | None, store: str) -> None:
    with pytest.raises(ValueError, match="workers 2 needs a kafka:// source and a redis://"):
        DaemonSettings(source=source, store=store, workers=2)


def test_cli_names_the_flag_and_the_range() -> None:
    result = CliRunner().invoke(run, ["--workers", "0"])
    assert result.exit_code == 2
    assert "--workers" in result.output and "1<=x<=64" in result.output
    result = CliRunner().invoke(run, ["--workers", "3"])
    assert result.exit_code == 2 and "needs a kafka:// source" in result.output


def run_args(bootstrap: str, topic: str, redis_url: str, namespace: str, workers: int) -> list:
    return daemon_args(bootstrap, topic, redis_url, namespace, "--workers", str(workers))


def children(pid: int) -> list[int]:
    """Child process ids of ``pid`` (Linux /proc)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
        except FileNotFoundError:  # a thread that ended since the listing: it has none
            continue
    return found


def worker_pids(daemon: DaemonProcess) -> list[int]:
    """The worker processes (the spawn start method also runs a resource tracker)."""
    pids = []
    for pid in children(daemon.process.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"resource_tracker" not in handle.read():
                pids.append(pid)
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def assigned_partitions(log: str, worker: bool) -> int:
    """Partitions handed to the primary (worker False) or to worker 1, over all rebalances."""
    pattern = r"(worker 1 )?kvcast\.daemon\.runner: assigned (.+)"
    return sum(
        len(match.group(2).split(", "))
        for match in re.finditer(pattern, log)
        if bool(match.group(1)) == worker
    )


@pytest.mark.integration
@pytest.mark.slow
def test_two_processes_split_the_partitions_and_match_the_reference(
    tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace
) -> None:
    args = run_args(kafka_bootstrap, kafka_topic, redis_url, redis_namespace, 2)
    daemon = DaemonProcess(args, tmp_path / "daemon.log")
    try:
        # The events go in only once both processes hold partitions: produced before, the
        # primary may consume them all before the worker joins, and the split proves nothing.
        # The group starts at the earliest offset, so nothing produced after the join is missed.
        wait_until(
            lambda: (
                assigned_partitions(daemon.text(), False) >= 1
                and assigned_partitions(daemon.text(), True) >= 1
            ),
            60,
            "the primary and worker 1 to hold partitions",
        )
        records: list = []
        produce(kafka_bootstrap, kafka_topic, soak_workload(6000, seed=4), records)
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 4, 90)
        assert compare(daemon, records) == []
        log = daemon.text()
        primary, worker = assigned_partitions(log, False), assigned_partitions(log, True)

        # One scrape covers both processes: every partition load of either is counted, once
        # the worker's next report (every second) has reached the primary.
        def loads() -> int | None:
            metrics = daemon.raw("/metrics").decode()
            found = re.search(
                r'kvcast_store_operation_seconds_count\{operation="load_partition"\} ([\d.]+)',
                metrics,
            )
            return int(float(found.group(1))) if found else None

        wait_until(lambda: loads() == primary + worker, 10, "the worker's partition loads")
        assert daemon.get("/readyz")["components"]["workers"] == "ok"
        # Each worker logs its own status line (the primary prints the instance's).
        worker_status = r"worker 1 kvcast\.daemon\.runner: kvcast worker \| [\d,]+ events/s \| lag"
        assert re.search(worker_status, daemon.text())
        pids = worker_pids(daemon)
        assert len(pids) == 1
        assert daemon.stop(signal.SIGTERM) == 0
        assert not alive(pids[0])
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)


@pytest.mark.integration
def test_a_sigterm_while_a_worker_is_still_starting_stops_the_instance_cleanly(
    tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace
) -> None:
    # The primary answers HTTP seconds before a spawned worker has imported the daemon and
    # installed its handlers; a SIGTERM sent to that worker then killed it (exit code -15),
    # and the instance exited 1 on an orderly stop (a fresh-clone CI run met it after a
    # restart on a loaded machine).
    daemon = DaemonProcess(
        run_args(kafka_bootstrap, kafka_topic, redis_url, redis_namespace, 2),
        tmp_path / "daemon.log",
    )
    try:
        pids = worker_pids(daemon)  # worker 1 is still importing (it joins seconds later)
        assert daemon.stop(signal.SIGTERM) == 0, daemon.text()[-3000:]
        assert "exited with code" not in daemon.text()
        assert not any(alive(pid) for pid in pids)
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_worker_stops_the_instance_and_the_restart_loses_nothing(
    tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace
) -> None:
    args = run_args(kafka_bootstrap, kafka_topic, redis_url, redis_namespace, 2)
    producer = Producer(kafka_bootstrap, kafka_topic, soak_workload(5000, seed=6), rate=400)
    first = DaemonProcess(args, tmp_path / "first.log")
    second = None
    try:
        producer.start()
        wait_until(lambda: assigned_partitions(first.text(), True) > 0, 60, "worker 1 to join")
        time.sleep(1.0)  # mid-stream
        (pid,) = worker_pids(first)
        os.kill(pid, signal.SIGKILL)
        assert first.process.wait(timeout=40) == 1
        assert "kvcast-worker-1 exited with code -9" in first.text()
        second = DaemonProcess(args, tmp_path / "second.log")
        producer.join(timeout=60)
        assert producer.error is None and len(producer.records) == 5000
        wait_consumed(redis_client, redis_namespace, kafka_topic, producer.records, 4, 90)
        assert compare(second, producer.records) == []
        assert second.stop(signal.SIGTERM) == 0, second.text()[-3000:]
    finally:
        for daemon in (first, second):
            if daemon is not None and daemon.process.poll() is None:
                daemon.stop(signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.slow
def test_workers_stop_when_the_primary_is_killed(
    tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace
) -> None:
    args = run_args(kafka_bootstrap, kafka_topic, redis_url, redis_namespace, 3)
    daemon = DaemonProcess(args, tmp_path / "daemon.log")
    wait_until(lambda: len(worker_pids(daemon)) == 2, 30, "two workers to start")
    pids = worker_pids(daemon)
    daemon.stop(signal.SIGKILL)
    wait_until(lambda: not any(alive(pid) for pid in pids), 30, "the orphaned workers to stop")
