"""The client through a Redis outage, and whole tables while the daemon republishes."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.exporters.kit.client import RedisTableSource, TableClient
from kvcast.lab.bench.processes import wait_until
from tests import services

pytestmark = pytest.mark.integration


def doc(version: int, states: int = 1) -> dict[str, Any]:
    """A table whose every row carries its version (in ``conversations``)."""
    rows = [
        {"intent": f"intent-{k % 31}", "turn": 1 + k // 31, "p_continue": (version % 100) / 100,
         "median_reuse_s": 60.0, "mu": None, "sigma": None, "conversations": version,
         "delay_samples": 0}
        for k in range(states)
    ]  # fmt: skip
    defaults = {"p_continue": 0.5, "median_reuse_s": 150.0}
    return {"version": version, "generated_at": float(version), "window_conversations": 1,
            "defaults": defaults, "states": rows}  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisProcess:
    """A throw-away redis-server on its own port that the test stops and restarts."""

    def __init__(self, port: int) -> None:
        self.port, self.url = port, f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while services.redis_error(self.url) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(redis.RedisError):
                redis.Redis.from_url(self.url).shutdown(nosave=True)
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    if shutil.which("redis-server") is None:
        services.missing("redis-server (binary)", "PATH", "not installed")
    server = RedisProcess(free_port())
    server.start()
    yield server
    server.stop()


def test_client_keeps_answering_through_a_redis_restart(own_redis: RedisProcess) -> None:
    refresh_s = 0.5
    store = RedisStore(own_redis.url, "outage", timeout_s=1.0)
    store.publish_table(doc(1))
    store.close()
    client = TableClient(own_redis.url, namespace="outage", refresh_s=refresh_s, timeout_s=0.5)
    with client:
        assert client.version == 1
        before = client.priority("intent-0", 1, 10.0, 32)
        own_redis.stop()
        # A refresh has failed (waited for: a fixed 1.5 s could pass before the refresher ran).
        wait_until(lambda: client.last_error is not None, 30, "a failed refresh")
        assert client.version == 1
        assert client.priority("intent-0", 1, 10.0, 32) == before

        own_redis.start()  # empty: the daemon republishes after the restart
        store = RedisStore(own_redis.url, "outage", timeout_s=1.0)
        store.publish_table(doc(2))
        published = time.monotonic()
        while client.version != 2 and time.monotonic() - published < 5:
            time.sleep(0.01)
        picked_up_s = time.monotonic() - published
        store.close()
    assert client.version == 2 and client.last_error is None
    # Within one refresh interval (+10% jitter) and one fetch.
    assert picked_up_s <= refresh_s * 1.1 + 0.5, picked_up_s
    assert client.priority("intent-0", 1, 10.0, 32) == (1, 0.02, 32)


def test_tables_read_while_republished_under_load_are_whole(
    redis_url: str, redis_namespace: str
) -> None:
    """Writers publish big tables as fast as they can; every read is one whole version."""
    states = 992  # 31 intents x 32 turns: ~150 kB of JSON
    stop = threading.Event()
    published: list[int] = []
    problems: list[str] = []
    reads = 0

    def writer(first: int) -> None:
        store = RedisStore(redis_url, redis_namespace)
        version = first
        while not stop.is_set():
            store.publish_table(doc(version, states))
            published.append(version)
            version += 2
        store.close()

    def reader() -> None:
        nonlocal reads
        client = redis.Redis.from_url(redis_url)
        source = RedisTableSource(redis_url, redis_namespace)
        while not stop.is_set():
            raw = client.get(source.key)
            if raw is None:
                continue
            try:
                table = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                problems.append(f"torn read: {exc}")
                continue
            versions = {row["conversations"] for row in table["states"]}
            if len(table["states"]) != states or versions != {table["version"]}:
                problems.append(f"mixed table: version {table['version']}, rows {versions}")
            reads += 1
        client.close()
        source.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in (1, 2)]
    threads += [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:  # interleaved until 100 versions were written and read, however slow the machine
        wait_until(lambda: len(published) > 100 and reads > 100, 60, "100 writes and 100 reads")
    finally:
        stop.set()
    for thread in threads:
        thread.join(timeout=10)
    assert problems == []
    assert len(published) > 20 and reads > 20, (len(published), reads)
