"""Daemon figures: Kafka -> Redis throughput, recovery after kill -9, memory of open conversations.

Needs a Kafka-protocol broker and a Redis (``scripts/services.sh start`` provides both).
Baselines run in the same call: a bare kafka-python consumer reading the same topic, so the
ratio says what the statistics and the atomic commits cost on top of merely consuming.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from kvcast.daemon.publisher import Publisher
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources.kafka_source import FETCH_SETTINGS, GROUP_SETTINGS, KafkaSource
from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.conversations import ConversationTracker
from kvcast.stats.events import parse_event
from kvcast.stats.partition import PartitionEngine

PARTITIONS = 4
# The in-process daemon again on topics of these many partitions (same events): how the rate
# and the Redis load move with the partitions an instance owns.
PARTITION_SWEEP = (1, PARTITIONS, 16)


@dataclass(frozen=True)
class DaemonRun:
    """The in-process daemon's rate and the load it put on Redis meanwhile."""

    partitions: int
    events_per_s: float
    # Commands Redis ran for the daemon, those inside its commit scripts included (the bench's
    # own polls left out): the server's work, not the round trips.
    redis_commands_per_s: float
    redis_cpu_per_s: float  # Redis server CPU seconds per wall second (1.0: one core busy)


@dataclass(frozen=True)
class RefreshCost:
    """One publisher refresh over the shared window: read it, snapshot, forecast, table."""

    window_conversations: int
    interval_s: float  # the refresh interval it runs at (the default)
    seconds: float  # wall time of Publisher.refresh_once, best of the rounds
    redis_commands: int  # commands Redis ran for that refresh
    redis_cpu_s: float  # Redis CPU seconds that refresh took


@dataclass(frozen=True)
class DaemonBenchResult:
    events: int
    consume_per_s: float  # bare kafka-python consumer, same topic
    daemon_per_s: float  # Kafka -> statistics -> Redis commits, classifier off
    recovery_s: float  # kill -9 -> restarted daemon committed again
    catch_up_s: float  # kill -9 -> restarted daemon caught up with the log
    open_conversation_bytes: float  # tracker memory per open 3-turn conversation
    flush_s_per_event: float  # RedisStore.commit time per event, default commit cadence
    apply_s_per_event: float  # PartitionEngine.apply time per event (same events, same run)
    flush_commits: int  # commits measured for the two figures above
    refresh: RefreshCost  # one publisher refresh over the window those commits left
    partition_sweep: list[DaemonRun]  # the in-process daemon per PARTITION_SWEEP entry
    workers: int  # processes of the multi-process instance measured below
    instance_one_per_s: float  # `kvcast run` (1 process) once started
    instance_workers_per_s: float  # `kvcast run --workers N` once started, same log

    def rows(self) -> list[tuple[str, str, str, str]]:
        per_million = self.open_conversation_bytes * 1e6 / 2**30
        return [
            (f"daemon, Kafka -> Redis ({PARTITIONS} partitions)",
             f"{self.daemon_per_s:,.0f} events/s",
             f"{self.consume_per_s:,.0f} events/s (bare consumer)",
             f"{self.daemon_per_s / self.consume_per_s:.2f}"),
            *[(f"daemon with {run.partitions} partition(s): rate and Redis load",
               f"{run.events_per_s:,.0f} events/s; Redis {run.redis_commands_per_s:,.0f}"
               f" commands/s ({run.redis_commands_per_s / run.events_per_s:.2f} per event),"
               f" {run.redis_cpu_per_s:.0%} of a core",
               f"{self.daemon_per_s:,.0f} events/s ({PARTITIONS} partitions)",
               f"{run.events_per_s / self.daemon_per_s:.2f}")
              for run in self.partition_sweep],
            (f"daemon, one instance of {self.workers} processes (--workers {self.workers})",
             f"{self.instance_workers_per_s:,.0f} events/s",
             f"{self.instance_one_per_s:,.0f} events/s (kvcast run, 1 process)",
             f"{self.instance_workers_per_s / self.instance_one_per_s:.2f}"),
            ("recovery after kill -9", f"{self.recovery_s:.1f} s to first commit,"
             f" {self.catch_up_s:.1f} s to caught up", "-", "-"),
            ("memory of open conversations", f"{per_million:.2f} GiB per million (3 turns)",
             "-", "-"),
            (f"publisher refresh (window of {self.refresh.window_conversations:,} conversations)",
             f"{self.refresh.seconds * 1e3:.0f} ms; Redis {self.refresh.redis_commands:,}"
             f" commands, {self.refresh.redis_cpu_s * 1e3:.1f} ms of its CPU",
             f"{self.refresh.interval_s:g} s (default refresh interval)",
             f"{self.refresh.seconds / self.refresh.interval_s:.3f} of it"),
            ("Redis flush cost per event (4 partitions, 10,000-event commits)",
             f"{self.flush_s_per_event * 1e6:.1f} µs/event ({self.flush_commits} commits)",
             f"{self.apply_s_per_event * 1e6:.1f} µs/event (applying them: PartitionEngine)",
             f"{self.flush_s_per_event / self.apply_s_per_event:.2f}"),
        ]  # fmt: skip


def _produce(bootstrap: str, conversations: int, partitions: int = PARTITIONS) -> tuple[str, int]:
    """A new topic holding the generated workload keyed by session: (topic, events)."""
    topic = f"kvcast-bench-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    trace = generate(preset("mixed"), lambda0=5.0, conversations=conversations, seed=3)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 18)
    count = 0
    for line, event in zip(trace.jsonl_lines(), trace.events(), strict=True):
        producer.send(topic, key=event["session_id"].encode(), value=line.rstrip(b"\n"))
        count += 1
    producer.flush()
    producer.close()
    return topic, count


def _bare_consume(bootstrap: str, topic: str, count: int) -> float:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bare-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **GROUP_SETTINGS,
        **FETCH_SETTINGS,  # the daemon's own consumer settings
    )
    seen, started = 0, None
    while seen < count:
        batch = consumer.poll(timeout_ms=200, max_records=2000)
        if batch and started is None:
            started = time.perf_counter()
        seen += sum(len(messages) for messages in batch.values())
    elapsed = time.perf_counter() - (started or time.perf_counter())
    consumer.close()
    return count / elapsed


def _committed(
    client: redis.Redis, namespace: str, topic: str, partitions: int = PARTITIONS
) -> int:
    """Events committed to Redis so far over the topic's partitions (one HGET each)."""
    prefix = f"{namespace}:{{{namespace}}}:part:{topic}:"
    return sum(int(client.hget(f"{prefix}{p}", "offset") or -1) + 1 for p in range(partitions))


def _redis_work(client: redis.Redis) -> tuple[int, float]:
    """(commands processed, CPU seconds used) by the Redis server since it started."""
    stats, cpu = client.info("stats"), client.info("cpu")
    return stats["total_commands_processed"], cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def _redis_work_since(client: redis.Redis, before: tuple[int, float]) -> tuple[int, float]:
    """(commands, CPU seconds) Redis has spent since the reading ``before``, leaving out the
    two INFO calls of that reading."""
    commands, cpu_s = _redis_work(client)
    return commands - before[0] - 2, cpu_s - before[1]


def _daemon_throughput(
    bootstrap: str, redis_url: str, topic: str, count: int, partitions: int = PARTITIONS
) -> DaemonRun:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    settings = DaemonSettings(
        source=f"kafka://{bootstrap}/{topic}", store=redis_url, namespace=namespace,
        group_id=f"bench-{namespace}", refresh_interval_s=5, status_interval_s=3600,
    )  # fmt: skip
    store = RedisStore(redis_url, namespace)
    source = KafkaSource(bootstrap, topic, settings.group_id)
    daemon = Daemon(settings, store, source, Publisher(settings, store, source.health))
    client = redis.Redis.from_url(redis_url)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    while daemon.events_seen == 0:
        time.sleep(0.01)
    started = time.perf_counter()
    before = _redis_work(client)
    polls = 1
    while _committed(client, namespace, topic, partitions) < count:
        polls += 1
        time.sleep(0.02)
    elapsed = time.perf_counter() - started
    commands, cpu_s = _redis_work_since(client, before)
    daemon.request_stop()
    thread.join()
    return DaemonRun(
        partitions=partitions,
        events_per_s=count / elapsed,
        # Each of the bench's polls is one HGET per partition.
        redis_commands_per_s=(commands - polls * partitions) / elapsed,
        redis_cpu_per_s=cpu_s / elapsed,
    )


def _run_args(bootstrap: str, redis_url: str, topic: str, namespace: str) -> list[str]:
    """``kvcast run`` on ``topic`` as a subprocess command line, classifier off."""
    return [
        sys.executable, "-m", "kvcast.cli.main", "run", "--source", f"kafka://{bootstrap}/{topic}",
        "--store", redis_url, "--namespace", namespace, "--metrics-addr", "127.0.0.1:0",
        "--classifier", "off",
    ]  # fmt: skip


def _instance_throughput(
    bootstrap: str, redis_url: str, topic: str, count: int, workers: int
) -> float:
    """Events/s of ``kvcast run --workers N`` once started: the rate from the first fifth of
    the log committed to all of it (so that start-up, imports and group joins, is left out)."""
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    args = [*_run_args(bootstrap, redis_url, topic, namespace), "--workers", str(workers)]
    client = redis.Redis.from_url(redis_url)
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while (start_count := _committed(client, namespace, topic)) < count // 5:
            _still_running(process)
            time.sleep(0.005)
        started = time.perf_counter()
        while _committed(client, namespace, topic) < count:
            _still_running(process)
            time.sleep(0.02)
        return (count - start_count) / (time.perf_counter() - started)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def _still_running(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        raise RuntimeError(f"kvcast run exited with code {process.returncode} during the bench")


def _workers_throughput(
    bootstrap: str, redis_url: str, topic: str, count: int, workers: int, rounds: int = 2
) -> tuple[float, float]:
    """(best events/s of one process, of ``workers`` processes), taking turns in each round."""
    one = many = 0.0
    for _ in range(rounds):
        one = max(one, _instance_throughput(bootstrap, redis_url, topic, count, 1))
        many = max(many, _instance_throughput(bootstrap, redis_url, topic, count, workers))
    return one, many


def _recovery(bootstrap: str, redis_url: str, topic: str, count: int) -> tuple[float, float]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    args = [*_run_args(bootstrap, redis_url, topic, namespace), "--commit-interval", "0.5"]
    client = redis.Redis.from_url(redis_url)
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while _committed(client, namespace, topic) < count // 3:
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at, before = time.perf_counter(), _committed(client, namespace, topic)
    second = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while _committed(client, namespace, topic) == before:
        time.sleep(0.01)
    recovered = time.perf_counter() - killed_at
    while _committed(client, namespace, topic) < count:
        time.sleep(0.02)
    caught_up = time.perf_counter() - killed_at
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=30)
    return recovered, caught_up


@dataclass(frozen=True)
class CommittedWorkload:
    """A namespace holding a committed workload, and what committing it cost (s per event)."""

    store: RedisStore
    namespace: str
    commit_s_per_event: float  # RedisStore.commit, taking the delta included
    apply_s_per_event: float  # PartitionEngine.apply
    commits: int


@contextmanager
def _committed_workload(redis_url: str, conversations: int = 10_000) -> Iterator[CommittedWorkload]:
    """The ``mixed`` workload committed to a fresh namespace; its keys are deleted on exit.

    Keyed into :data:`PARTITIONS` partitions as a producer keying by session would, one delta
    per partition every ``commit_max_events`` events (the daemon's default cadence), each
    committed by :meth:`RedisStore.commit`.
    """
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, namespace)
    config, settings = StatsConfig(), DaemonSettings()
    trace = generate(preset("mixed"), lambda0=5.0, conversations=conversations, seed=3)
    events = [parse_event(line) for line in trace.jsonl_lines()]
    engines = [PartitionEngine(config, f"bench:{p}") for p in range(PARTITIONS)]
    apply_s = commit_s = 0.0
    commits = pending = 0
    try:
        for offset, event in enumerate(events):
            engine = engines[zlib.crc32(event.session_id.encode()) % PARTITIONS]
            started = time.perf_counter()
            engine.apply(event, event.intent or "unknown", offset)
            apply_s += time.perf_counter() - started
            pending += 1
            if pending == settings.commit_max_events or offset == len(events) - 1:
                pending = 0
                for engine in engines:
                    started = time.perf_counter()
                    store.commit(engine.take_delta())
                    commit_s += time.perf_counter() - started
                    commits += 1
        yield CommittedWorkload(
            store, namespace, commit_s / len(events), apply_s / len(events), commits
        )
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        store.close()


def _flush_cost(redis_url: str, conversations: int = 10_000) -> tuple[float, float, int]:
    """(s per event committing to Redis, s per event applying to the engines, commits)."""
    with _committed_workload(redis_url, conversations) as workload:
        return workload.commit_s_per_event, workload.apply_s_per_event, workload.commits


def _refresh_cost(workload: CommittedWorkload, redis_url: str, rounds: int = 5) -> RefreshCost:
    """What every instance's publisher costs per ``refresh_interval_s``, on that window."""
    settings = DaemonSettings(store=redis_url, namespace=workload.namespace)
    publisher = Publisher(settings, workload.store, lambda: (True, "ok"))
    client = redis.Redis.from_url(redis_url)
    best: RefreshCost | None = None
    for _ in range(rounds):
        before = _redis_work(client)
        started = time.perf_counter()
        publisher.refresh_once()
        elapsed = time.perf_counter() - started
        commands, cpu_s = _redis_work_since(client, before)
        forecast = publisher.published.forecast_document() or {}
        cost = RefreshCost(
            window_conversations=int(forecast.get("window_conversations") or 0),
            interval_s=settings.refresh_interval_s,
            seconds=elapsed,
            redis_commands=commands,
            redis_cpu_s=cpu_s,
        )
        if best is None or cost.seconds < best.seconds:
            best = cost
    assert best is not None
    return best


def _open_conversation_bytes(conversations: int = 100_000) -> float:
    config = StatsConfig(completion_timeout_s=1e9)
    tracker = ConversationTracker(config)
    events = [
        parse_event(
            {"session_id": f"session-{i:09d}", "turn": t, "timestamp": float(i) + t,
             "input_tokens": 200 * t, "output_tokens": 50, "intent": "code_generation"}
        )
        for i in range(conversations)
        for t in (1, 2, 3)
    ]  # fmt: skip
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for event in events:
        tracker.observe(event, "code_generation")
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert tracker.open_conversations == conversations
    return (after - before) / conversations


def run_daemon_bench(
    bootstrap: str, redis_url: str, conversations: int = 40_000, workers: int = 2
) -> DaemonBenchResult:
    topic, count = _produce(bootstrap, conversations)
    consume = _bare_consume(bootstrap, topic, count)
    daemon = _daemon_throughput(bootstrap, redis_url, topic, count)
    sweep = []
    for partitions in PARTITION_SWEEP:
        if partitions == PARTITIONS:
            sweep.append(daemon)
            continue
        other_topic, other_count = _produce(bootstrap, conversations, partitions)
        sweep.append(_daemon_throughput(bootstrap, redis_url, other_topic, other_count, partitions))
    one, many = _workers_throughput(bootstrap, redis_url, topic, count, workers)
    recovered, caught_up = _recovery(bootstrap, redis_url, topic, count)
    with _committed_workload(redis_url) as workload:
        refresh = _refresh_cost(workload, redis_url)
    return DaemonBenchResult(
        events=count,
        consume_per_s=consume,
        daemon_per_s=daemon.events_per_s,
        recovery_s=recovered,
        catch_up_s=caught_up,
        open_conversation_bytes=_open_conversation_bytes(),
        flush_s_per_event=workload.commit_s_per_event,
        apply_s_per_event=workload.apply_s_per_event,
        flush_commits=workload.commits,
        refresh=refresh,
        partition_sweep=sweep,
        workers=workers,
        instance_one_per_s=one,
        instance_workers_per_s=many,
    )


__all__ = ["DaemonBenchResult", "run_daemon_bench"]
