"""Soak: ``kvcast run`` under a steady load with periodic kill -9 and Redis restarts.

    python -m kvcast.lab.bench.soak --minutes 120 --bootstrap 127.0.0.1:19092

A producer thread sends a generated intent-mixed workload at ``--rate`` events/s to a fresh
topic for ``--minutes``; meanwhile the daemon (a subprocess) is killed with SIGKILL every
``--kill-every`` seconds and restarted, and its Redis (an own ``redis-server`` with an
append-only file, fsync always, as a production Redis) is stopped and restarted every
``--redis-restart-every`` seconds (alternately SIGTERM and SIGKILL). At the end the published
table, forecast and rejection counters must equal an offline computation of the same records
(one engine per partition in offset order, merged): the process exits 1 on any difference.
The daemon's resident memory is sampled every 10 s; the summary line gives the peak and the
longest-lived daemon's at half its life and at its end (``--kill-every 0`` keeps one daemon for
the whole run, to see memory flatten rather than grow).

Needs a Kafka-protocol broker (``scripts/services.sh start``) and ``redis-server`` on PATH.
The pieces (``reference``, ``compare``, ``Producer``; ``OwnRedis`` and ``DaemonProcess`` from
``processes.py``) serve the reliability tests too.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from kvcast.daemon.refresh import capacity_grid
from kvcast.lab.bench.processes import DaemonProcess, OwnRedis, wait_until
from kvcast.stats.config import StatsConfig
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.replay import offline_statistics
from kvcast.stats.table import table_document

STATS = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30)
CAPACITY = 3000
STATS_FLAGS = ["--completion-timeout", "900", "--allowed-lateness", "30",
               "--capacity-blocks", str(CAPACITY)]  # fmt: skip
FAST_FLAGS = ["--metrics-addr", "127.0.0.1:0", "--commit-interval", "0.2",
              "--refresh-interval", "0.3", "--table-interval", "0.1", "--status-interval", "1",
              "--max-backoff", "0.5", "--classifier", "off"]  # fmt: skip
FORECAST_KEYS = ("hit_ratio", "hit_ratio_single_class", "upper_bound", "lambda0", "A_R", "E_B")
Records = list[tuple[int, int, bytes]]  # (partition, offset, payload)


def reference(
    records: Records, stats: StatsConfig = STATS, capacity: int = CAPACITY
) -> tuple[dict, dict, dict[str, int]]:
    """(table, forecast, rejections by reason) computed offline from ``records``."""
    snapshot, rejected = offline_statistics(records, stats)
    forecast = forecast_from_sample(
        snapshot.sample, capacity_blocks=capacity, capacities=capacity_grid(capacity)
    ).to_dict()
    return table_document(snapshot, stats, 0), forecast, dict(rejected)


def rejections_from_metrics(text: str) -> dict[str, int]:
    found = re.findall(r'kvcast_events_rejected_total\{reason="(\w+)"\} ([\d.e+]+)', text)
    return {reason: int(float(value)) for reason, value in found if float(value)}


def compare(
    daemon: DaemonProcess,
    records: Records,
    stats: StatsConfig = STATS,
    capacity: int = CAPACITY,
    timeout: float = 20,
) -> list[str]:
    """Differences between what ``daemon`` publishes and the offline reference (empty: equal).

    Polls for up to ``timeout`` s until the published table, forecast and rejection counts all
    equal the reference (each refresh publishes them from the stored state), then reports what
    still differs. The table alone is not enough to stop on: a refresh over a window emptied
    by a store that lost its data keeps the last good table but forecasts from the empty window.
    """
    table, forecast, rejected = reference(records, stats, capacity)
    deadline = time.monotonic() + timeout
    while True:
        try:
            published_table, published = daemon.get("/v1/table"), daemon.get("/v1/forecast")
        except urllib.error.HTTPError as error:  # 503 while warming up
            if time.monotonic() > deadline:
                return [f"{error.url}: HTTP {error.code} {error.read()[:200]!r}"]
            time.sleep(0.3)
            continue
        metrics = rejections_from_metrics(daemon.raw("/metrics").decode())
        differences = _differences(published_table, published, metrics, table, forecast, rejected)
        if not differences or time.monotonic() > deadline:
            return differences
        time.sleep(0.3)


def _differences(
    published_table: dict, published: dict, metrics: dict[str, int],
    table: dict, forecast: dict, rejected: dict[str, int],
) -> list[str]:  # fmt: skip
    differences = []
    if published_table["states"] != table["states"]:
        differences.append("table states")
    if published_table["window_conversations"] != table["window_conversations"]:
        differences.append("window_conversations")
    differences += [f"forecast {key}" for key in FORECAST_KEYS if published[key] != forecast[key]]
    if published["curve"] != forecast["curve"]:
        differences.append("forecast curve")
    if metrics != rejected:
        differences.append(f"rejections {metrics} != {rejected}")
    return differences


def stored_offsets(client, namespace: str, topic: str, partitions: int) -> list[int]:
    prefix = f"{namespace}:{{{namespace}}}:part:{topic}:"
    return [int(client.hget(f"{prefix}{p}", "offset") or -1) for p in range(partitions)]


def last_offsets(records: Records, partitions: int) -> list[int]:
    last = [-1] * partitions
    for partition, offset, _ in records:
        last[partition] = max(last[partition], offset)
    return last


def wait_consumed(redis_client, namespace, topic, records, partitions, timeout=60) -> None:
    want = last_offsets(records, partitions)
    wait_until(
        lambda: stored_offsets(redis_client, namespace, topic, partitions) == want,
        timeout, f"the daemon to store offsets {want}",
    )  # fmt: skip


def workload(events: int, seed: int) -> list[bytes]:
    """``events`` generated intent-mixed events (no text), in event-time order.

    A quarter conversation per second, so that even a short workload spans several completion
    timeouts (900 s) and completes conversations.
    """
    from kvcast.lab.workload.generator import generate
    from kvcast.lab.workload.presets import preset

    trace = generate(preset("mixed"), lambda0=0.25, conversations=events, seed=seed)
    return [line.rstrip(b"\n") for line in trace.jsonl_lines()][:events]


class Producer(threading.Thread):
    """Sends ``lines`` keyed by session at ``rate`` events/s; ``records`` fills as acks come."""

    def __init__(self, bootstrap: str, topic: str, lines: list[bytes], rate: float) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.bootstrap, self.topic, self.lines, self.rate = bootstrap, topic, lines, rate
        self.records: Records = []
        self.error: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaProducer

        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, acks=1)
            started = time.monotonic()
            futures = []
            for index, line in enumerate(self.lines):
                delay = started + index / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                key = orjson.loads(line)["session_id"].encode()
                futures.append((producer.send(self.topic, key=key, value=line), line))
            producer.flush()
            for future, line in futures:
                metadata = future.get(timeout=30)
                self.records.append((metadata.partition, metadata.offset, line))
            producer.close()
        except BaseException as exc:  # reported by the caller
            self.error = exc


@dataclass
class SoakResult:
    events: int = 0
    kills: int = 0
    redis_restarts: int = 0
    restarts_joined: int = 0
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rss_samples: list[tuple[int, float, int]] = field(default_factory=list)
    """(daemon index, its age in s, resident memory in bytes), every ``RSS_EVERY_S``."""

    def memory(self) -> tuple[float, float, float] | None:
        """(peak RSS MiB, the longest-lived daemon's RSS at half its life and at its end, MiB)."""
        if not self.rss_samples:
            return None
        lives: dict[int, list[tuple[float, int]]] = {}
        for index, age, rss in self.rss_samples:
            lives.setdefault(index, []).append((age, rss))
        longest = max(lives.values(), key=lambda samples: samples[-1][0])
        half = next(rss for age, rss in longest if age >= longest[-1][0] / 2)
        mib = 1 << 20
        return max(r for _, _, r in self.rss_samples) / mib, half / mib, longest[-1][1] / mib

    def line(self) -> str:
        memory = self.memory()
        rss = (
            f", peak RSS {memory[0]:.0f} MiB, longest-lived daemon {memory[1]:.0f} MiB at half"
            f" its life, {memory[2]:.0f} MiB at its end"
            if memory
            else ""
        )
        return (
            f"soak: {self.events} events, {self.kills} daemon kill -9, {self.redis_restarts} "
            f"redis restarts, {self.restarts_joined} restarts joined the group, "
            f"{len(self.differences)} differences, {self.seconds:.0f} s{rss}"
        )


RSS_EVERY_S = 10.0


def resident_bytes(pid: int) -> int | None:
    """Resident set size of a live process (Linux /proc), None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def soak(
    bootstrap: str,
    workdir: Path,
    duration_s: float,
    kill_every_s: float,
    redis_restart_every_s: float | None,
    rate: float = 200.0,
    seed: int = 1,
    partitions: int = 4,
    say: Callable[[str], None] = print,
) -> SoakResult:
    """Run the soak; the result's ``differences`` must be empty."""
    from kafka.admin import KafkaAdminClient, NewTopic

    started = time.monotonic()
    rng = random.Random(seed)
    result = SoakResult()
    topic, namespace = f"kvcast-soak-{seed}-{os.getpid()}-{int(time.time())}", "soak"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    redis_server = OwnRedis(workdir)
    args = ["--source", f"kafka://{bootstrap}/{topic}", "--store", redis_server.url,
            "--namespace", namespace, *FAST_FLAGS, *STATS_FLAGS]  # fmt: skip
    producer = Producer(bootstrap, topic, workload(int(duration_s * rate), seed), rate)
    daemons: list[DaemonProcess] = []

    born: list[float] = []

    def start_daemon() -> DaemonProcess:
        daemon = DaemonProcess(args, workdir / f"daemon-{len(daemons)}.log")
        daemons.append(daemon)
        born.append(time.monotonic())
        return daemon

    try:
        daemon = start_daemon()
        producer.start()
        end = started + duration_s
        kills = kill_every_s > 0
        next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every_s if kills else math.inf
        next_rss = time.monotonic()
        next_redis = (
            time.monotonic() + rng.uniform(0.5, 1.5) * redis_restart_every_s
            if redis_restart_every_s
            else float("inf")
        )
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_rss:
                rss = resident_bytes(daemon.process.pid)
                if rss is not None:
                    age = now - born[-1]
                    result.rss_samples.append((len(daemons) - 1, age, rss))
                next_rss = now + RSS_EVERY_S
            if now >= next_kill:
                daemon.stop(signal.SIGKILL)
                result.kills += 1
                say(f"soak: kill -9 #{result.kills} at {now - started:.1f} s")
                daemon = start_daemon()
                wait_until(daemon.assigned, 60, "the restarted daemon to join the group")
                result.restarts_joined += 1
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every_s
            elif now >= next_redis:
                sig = signal.SIGKILL if result.redis_restarts % 2 else signal.SIGTERM
                redis_server.restart(sig, down_s=rng.uniform(0.2, 2.0))
                result.redis_restarts += 1
                say(f"soak: redis restart #{result.redis_restarts} ({sig.name})")
                next_redis = time.monotonic() + rng.uniform(0.5, 1.5) * redis_restart_every_s
            time.sleep(0.05)
        producer.join(timeout=max(60.0, duration_s))
        if producer.error is not None:
            raise RuntimeError(f"producer failed: {producer.error!r}")
        client = redis_server.client()
        wait_consumed(client, namespace, topic, producer.records, partitions, timeout=120)
        client.close()
        result.events = len(producer.records)
        result.differences = compare(daemon, producer.records)
        if daemon.stop(signal.SIGTERM) != 0:
            result.differences.append("SIGTERM exit status not 0")
    finally:
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.stop(signal.SIGKILL)
        redis_server.stop(signal.SIGKILL)
        with contextlib.suppress(Exception):
            admin.delete_topics([topic])
        admin.close()
    result.seconds = time.monotonic() - started
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvcast.lab.bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=60.0, help="load duration (min)")
    parser.add_argument("--bootstrap", default="127.0.0.1:19092", help="Kafka HOST:PORT")
    parser.add_argument("--rate", type=float, default=200.0, help="events per second")
    parser.add_argument(
        "--kill-every", type=float, default=60.0, help="mean s between kill -9 (0: never)"
    )
    parser.add_argument(
        "--redis-restart-every", type=float, default=150.0, help="mean s between Redis restarts"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None, help="logs and the AOF (tmp dir)")
    options = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvcast-soak-") as tmp:
        workdir = options.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = soak(
            options.bootstrap, workdir, options.minutes * 60, options.kill_every,
            options.redis_restart_every, options.rate, options.seed,
        )  # fmt: skip
    print(result.line())
    for difference in result.differences:
        print(f"soak: DIFFERENCE {difference}")
    return 1 if result.differences else 0


if __name__ == "__main__":
    sys.exit(main())
