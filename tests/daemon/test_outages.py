"""Redis and the broker going away under a running daemon: not ready, then recovered, nothing lost.

The test owns its Redis (append-only file, so a restart keeps the state, as a production Redis
would) and its broker (``own_redis``, ``own_broker`` in the top-level conftest), so it can freeze
(SIGSTOP), thaw and restart them without disturbing the shared test services.
"""

from __future__ import annotations

import os
import signal

import pytest
import redis
from kafka.admin import KafkaAdminClient, NewTopic

from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.lab.bench.soak import Records, compare, wait_consumed
from tests.support import produce, readiness

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_store_and_broker_outages_lose_nothing(own_redis, own_broker, tmp_path) -> None:
    from kvcast.lab.workload.generator import generate
    from kvcast.lab.workload.presets import preset

    address, broker = own_broker
    topic = "requests"
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    trace = generate(preset("mixed"), lambda0=2.0, conversations=1200, seed=33, prompts=False)
    lines = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    half = len(lines) // 2
    records: Records = []
    produce(address, topic, lines[:half], records)
    namespace = "outage"
    daemon = DaemonProcess(
        ["--source", f"kafka://{address}/{topic}", "--store", own_redis.url,
         "--namespace", namespace, "--metrics-addr", "127.0.0.1:0", "--commit-interval", "0.2",
         "--refresh-interval", "0.3", "--table-interval", "0.1", "--max-backoff", "0.5",
         "--completion-timeout", "900", "--allowed-lateness", "30", "--capacity-blocks", "3000"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        client = redis.Redis.from_url(own_redis.url)
        wait_consumed(client, namespace, topic, records, 4)
        wait_until(lambda: readiness(daemon)[0] == 200, 30, "ready")

        # Redis frozen: not ready, naming the store; nothing may be lost meanwhile.
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        produce(address, topic, lines[half : half + 500], records)
        wait_until(lambda: readiness(daemon)[0] == 503, 30, "not ready while redis is frozen")
        assert readiness(daemon)[1]["components"]["store"] != "ok"
        os.kill(own_redis.process.pid, signal.SIGCONT)
        wait_until(lambda: readiness(daemon)[0] == 200, 30, "ready after redis thawed")

        # Redis restarted (its append-only file keeps the state, as in production).
        own_redis.restart()
        produce(address, topic, lines[half + 500 : half + 1000], records)
        wait_consumed(client, namespace, topic, records, 4)

        # The broker frozen: the source reports it, then everything resumes.
        os.kill(broker.pid, signal.SIGSTOP)
        wait_until(lambda: readiness(daemon)[0] == 503, 40, "not ready while the broker is frozen")
        assert readiness(daemon)[1]["components"]["source"] != "ok"
        os.kill(broker.pid, signal.SIGCONT)
        produce(address, topic, lines[half + 1000 :], records)
        wait_consumed(client, namespace, topic, records, 4, 90)
        wait_until(lambda: readiness(daemon)[0] == 200, 40, "ready after the broker thawed")
        assert compare(daemon, records) == []
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
