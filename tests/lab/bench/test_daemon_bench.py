"""The daemon benchmark's own instruments: the rate, and the Redis load that rate costs."""

from __future__ import annotations

import pytest
import redis

from kvcast.lab.bench.daemon_bench import (
    PARTITIONS,
    _committed_workload,
    _daemon_throughput,
    _produce,
    _redis_work,
    _redis_work_since,
    _refresh_cost,
)

pytestmark = pytest.mark.integration

# These tests count the commands a Redis served: each runs its own Redis (``own_redis``), so
# that other tests, in the other pytest-xdist worker, do not add theirs to the count.


def test_redis_work_counts_every_command_including_its_own_reading(own_redis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    commands_before, cpu_before = _redis_work(client)
    for _ in range(100):
        client.ping()
    commands_after, cpu_after = _redis_work(client)
    # The daemon bench subtracts the two INFO calls of a reading, as here.
    assert commands_after - commands_before == 100 + 2
    assert cpu_after >= cpu_before


def test_redis_work_since_leaves_out_its_own_reading(own_redis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    before = _redis_work(client)
    for _ in range(100):
        client.ping()
    commands, cpu_s = _redis_work_since(client, before)
    assert commands == 100 and cpu_s >= 0


@pytest.mark.parametrize("partitions", [1, 4])
def test_the_daemon_run_reports_its_rate_and_the_redis_load_it_caused(
    kafka_bootstrap: str, own_redis, partitions: int
) -> None:
    topic, count = _produce(kafka_bootstrap, conversations=1_500, partitions=partitions)
    run = _daemon_throughput(kafka_bootstrap, own_redis.url, topic, count, partitions)
    assert run.partitions == partitions
    assert run.events_per_s > 0
    # Commits carry per-bucket and per-second counters (HINCRBYs inside one script), so the
    # commands per event stay a few at most; a command per event and field would exceed it.
    assert 0 < run.redis_commands_per_s < 5 * run.events_per_s
    assert 0 <= run.redis_cpu_per_s < 2.0  # CPU seconds per second of a one-threaded server


def test_a_publisher_refresh_reads_the_committed_window_and_reports_its_cost(
    own_redis,
) -> None:
    redis_url = own_redis.url
    # 10,000 conversations at 5/s span more than the 1,800 s completion timeout, so the
    # committed window holds completed conversations for the refresh to read.
    with _committed_workload(redis_url, conversations=10_000) as workload:
        assert workload.commits >= PARTITIONS and workload.commit_s_per_event > 0
        refresh = _refresh_cost(workload, redis_url, rounds=2)
    assert refresh.window_conversations > 0
    assert refresh.redis_commands > 0 and refresh.seconds > 0 and refresh.redis_cpu_s >= 0
