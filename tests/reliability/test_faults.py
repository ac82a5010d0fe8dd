"""Faults injected into a running daemon against real services; the statistics must equal an
uninterrupted run's (the offline reference of the same records), rejections included.

Two ways the broker goes away. ``test_broker_restarted_mid_stream`` really restarts it: the
broker process is killed (SIGKILL, SIGTERM) and a new one started on the same address. The tansu
build the tests run has one storage engine compiled in, object storage (``memory://`` or
``s3://``; Postgres and SQLite are not in this build), so that test's broker keeps its record
batches, watermarks, groups and committed offsets in S3 objects, served by a small S3 of the
test process that outlives the broker process as a disk would (``durable_broker`` in
conftest.py). The shared test broker, and ``own_broker``, keep their topics in memory: a restart
of those would lose the log itself, which no consumer can survive, so
``test_redis_killed_and_broker_frozen_mid_stream`` freezes its broker instead (SIGSTOP/SIGCONT:
connections time out and the group coordinator disappears for longer than the session timeout,
then the same process comes back with its log).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import orjson
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.lab.bench.soak import (
    FAST_FLAGS,
    STATS_FLAGS,
    Producer,
    Records,
    compare,
    last_offsets,
    stored_offsets,
    wait_consumed,
    workload,
)
from tests.reliability.tally import TALLY
from tests.support import daemon_args, produce, readiness, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def read_log(bootstrap: str, topic: str, last: list[int], timeout: float = 30) -> Records:
    """Every record the topic holds, read back without a group: at least up to the offsets
    ``last`` (by partition), then until a poll brings nothing. (end_offsets cannot say where
    the log ends: tansu answers ListOffsets with the last batch's base offset + 1, or older.)"""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        assigned = [TopicPartition(topic, p) for p in range(len(last))]
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        records: Records = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"could not read the log up to {last}"
            batches = consumer.poll(timeout_ms=1000)
            for tp, messages in batches.items():
                records += [(tp.partition, m.offset, m.value) for m in messages]
            behind = any(consumer.position(tp) <= last[tp.partition] for tp in assigned)
            if not batches and not behind:
                return records
    finally:
        consumer.close()


def record(records: Records, differences: list[str], faults: int, iterations: int = 1) -> None:
    TALLY.add(
        faults=faults, iterations=iterations, events_compared=len(records),
        differences=len(differences),
    )  # fmt: skip


def test_kill_9_at_random_points_five_times(
    tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace
) -> None:
    """Five kill -9 at seeded random moments under a steady load; every restart joins the
    group and resumes from its checkpoints; nothing is lost or counted twice."""
    rng = random.Random(9)
    args = daemon_args(kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    producer = Producer(kafka_bootstrap, kafka_topic, workload(9000, seed=9), rate=250)
    daemons: list[DaemonProcess] = []
    try:
        producer.start()
        for kill in range(5):
            daemon = DaemonProcess(args, tmp_path / f"daemon-{kill}.log")
            daemons.append(daemon)
            wait_until(daemon.assigned, 60, f"restart {kill} to join the group")
            time.sleep(rng.uniform(0.2, 2.5))  # somewhere in consuming, applying, committing
            daemon.stop(signal.SIGKILL)
        daemon = DaemonProcess(args, tmp_path / "daemon-final.log")
        daemons.append(daemon)
        producer.join(timeout=90)
        assert producer.error is None and len(producer.records) == 9000
        wait_consumed(redis_client, redis_namespace, kafka_topic, producer.records, 4, 90)
        differences = compare(daemon, producer.records)
        record(producer.records, differences, faults=5, iterations=5)
        assert differences == []
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.stop(signal.SIGKILL)


def test_redis_killed_and_broker_frozen_mid_stream(own_redis, own_broker, tmp_path) -> None:
    """Redis killed (SIGKILL) for seconds while events keep coming, then restarted from its
    append-only file; then the broker frozen for longer than the group's session timeout.
    The daemon is not ready meanwhile (naming the component), pauses once
    --max-uncommitted-events await the store, and ends with the reference statistics."""
    address, broker = own_broker
    topic, namespace = "requests", "faults"
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    lines = workload(4000, seed=33)
    records: Records = []
    produce(address, topic, lines[:1000], records)
    daemon = DaemonProcess(
        ["--source", f"kafka://{address}/{topic}", "--store", own_redis.url,
         "--namespace", namespace, *FAST_FLAGS, *STATS_FLAGS,
         "--commit-max-events", "100", "--max-uncommitted-events", "400"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    client = own_redis.client()
    try:
        wait_consumed(client, namespace, topic, records, 4)
        own_redis.stop(signal.SIGKILL)
        produce(address, topic, lines[1000:2500], records)
        wait_until(lambda: readiness(daemon)[0] == 503, 30, "not ready while redis is down")
        assert readiness(daemon)[1]["components"]["store"] != "ok"
        wait_until(lambda: b"pausing consumption" in daemon.log.read_bytes(), 30, "a pause")
        time.sleep(2)
        own_redis.start()
        wait_consumed(client, namespace, topic, records, 4)
        wait_until(lambda: readiness(daemon)[0] == 200, 30, "ready after redis returned")

        os.kill(broker.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: readiness(daemon)[0] == 503, 40, "not ready: broker frozen")
            assert readiness(daemon)[1]["components"]["source"] != "ok"
            time.sleep(7)  # past the group's session timeout (6 s)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        produce(address, topic, lines[2500:], records)
        wait_consumed(client, namespace, topic, records, 4, timeout=90)
        wait_until(lambda: readiness(daemon)[0] == 200, 40, "ready after the broker thawed")
        differences = compare(daemon, records)
        record(records, differences, faults=2)
        assert differences == []
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        client.close()
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)


class SentUntil:
    """``lines`` handed out in order until ``release`` is set and ``least`` have gone (or the
    lines run out): a producer over them is still sending at any moment before the release."""

    def __init__(self, lines: list[bytes], least: int) -> None:
        self.lines, self.least = lines, least
        self.release = threading.Event()
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        for line in self.lines:
            if self.sent >= self.least and self.release.is_set():
                return
            self.sent += 1
            yield line


def test_broker_restarted_mid_stream(own_redis, durable_broker, tmp_path) -> None:
    """The broker process killed three times (SIGKILL, SIGTERM, SIGKILL) at seeded random moments
    while the daemon consumes and, at least twice, while a producer is still sending; each time
    a new broker process starts on the same address over the same storage (log, group,
    committed offsets). The daemon is not ready while the broker is down (naming the source),
    ready again once it has rejoined, and ends with the reference statistics of everything the
    log holds; every event the producer had acknowledged is in that log (the events a killed
    broker stored without acknowledging them are there too, once more after the retry)."""
    broker = durable_broker
    topic, namespace, partitions = "requests", "restarts", 4
    admin = KafkaAdminClient(bootstrap_servers=broker.address)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    rng = random.Random(51)
    # 7,000 events at 200/s (35 s) at least, and on until the second kill: on a loaded machine
    # the kills and rejoins outlast 35 s, and a producer that had finished made "while sending"
    # false (100 s of events in hand for that).
    lines = SentUntil(workload(20_000, seed=51), least=7000)
    producer = Producer(broker.address, topic, lines, rate=200)  # type: ignore[arg-type]
    producer.start()  # while the daemon starts
    daemon = start_daemon(tmp_path, broker.address, topic, own_redis.url, namespace)
    client = own_redis.client()
    kills = (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL)
    while_sending = 0

    def consuming() -> bool:
        return max(stored_offsets(client, namespace, topic, partitions)) >= 0

    try:
        wait_until(consuming, 40, "the daemon to store its first checkpoint")
        for number, sig in enumerate(kills):
            time.sleep(rng.uniform(0.5, 2.0))  # somewhere in fetching, applying, committing
            while_sending += producer.is_alive()
            broker.kill(sig)
            # Within the coordinator's 3 s grace and a poll: well before the 30 s no-poll rule,
            # which would also flag a main loop stuck on a request to the dead broker.
            wait_until(lambda: readiness(daemon)[0] == 503, 10, f"not ready: broker down {number}")
            assert readiness(daemon)[1]["components"]["source"] != "ok"
            time.sleep(rng.uniform(0.0, 1.5))
            broker.start()
            wait_until(lambda: readiness(daemon)[0] == 200, 30, f"ready after restart {number}")
            if number == 1:
                lines.release.set()  # killed twice while sending: the producer may finish
        assert while_sending >= 2, "the broker must be killed while events are being sent"
        producer.join(timeout=60)
        assert producer.error is None and len(producer.records) == lines.sent >= 7000
        log = read_log(broker.address, topic, last_offsets(producer.records, partitions))
        assert set(producer.records) <= set(log), "an acknowledged event is not in the log"
        wait_consumed(client, namespace, topic, log, partitions, timeout=60)
        differences = compare(daemon, log)
        record(log, differences, faults=len(kills), iterations=len(kills))
        assert differences == []
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        client.close()
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)


def test_clock_jumps_in_event_time(
    tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace
) -> None:
    """Far-past events are too_late (counted); a far-future event moves its partition's
    watermark, completes that partition's open conversations and makes the rest of it too_late.
    The published statistics equal the reference, and the too_late count equals the contract's:
    per partition, events older than the newest accepted time minus the allowed lateness.

    The jump is two hours (past the completion timeout, within the 24 h window): a jump of
    years would, by the same contract, empty the window of every partition (all buckets older
    than --window-max-age before the newest event) and leave its partition too_late until real
    time catches up; the published table and forecast then stay "warming_up"."""
    lines = workload(2400, seed=4)
    newest = max(orjson.loads(line)["timestamp"] for line in lines)
    far_past = [
        orjson.dumps({"session_id": f"past-{n}", "turn": 1, "timestamp": float(n),
                      "input_tokens": 10, "output_tokens": 1})
        for n in range(8)
    ]  # fmt: skip
    far_future = [
        orjson.dumps({"session_id": f"future-{n}", "turn": 1, "input_tokens": 10,
                      "output_tokens": 1, "timestamp": newest + 7200.0 + n})
        for n in range(2)
    ]  # fmt: skip
    sequence = [*lines[:800], *far_past, *lines[800:1600], *far_future, *lines[1600:]]
    records: Records = []
    produce(kafka_bootstrap, kafka_topic, sequence, records)
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    try:
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 4)
        expected_late = 0
        newest_by_partition: dict[int, float] = {}
        for partition, _, payload in sorted(records, key=lambda r: (r[0], r[1])):
            ts = orjson.loads(payload)["timestamp"]
            if ts < newest_by_partition.get(partition, float("-inf")) - 30:
                expected_late += 1
            else:
                newest_by_partition[partition] = max(ts, newest_by_partition.get(partition, ts))
        assert expected_late > len(far_past)  # the future jump made later events late too
        differences = compare(daemon, records)
        metrics = daemon.raw("/metrics").decode()
        assert f'kvcast_events_rejected_total{{reason="too_late"}} {expected_late}.0' in metrics
        record(records, differences, faults=len(far_past) + len(far_future))
        assert differences == []
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
