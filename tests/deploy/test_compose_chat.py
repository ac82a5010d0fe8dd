"""The compose stack's chat path, run here as its services' own commands: chat client ->
``kvcast tap`` -> engine stand-in, the tap's events -> Kafka -> ``kvcast run`` -> Redis.

No Docker engine is available, so each service of ``deploy/compose/compose.yaml`` on that path
runs as a local process with the command the compose file gives it. Only the addresses change
(compose host names to loopback ports, the broker and Redis to the suite's), plus the suite's
short intervals, a 5 s completion timeout and 1 s of allowed lateness, so that conversations
finish within the test, on a topic of one partition (whose event time every chat moves on).
The chat client sends no session id; the tap must recover each conversation from its history.
No user text may reach Kafka, Redis, the logs, the metrics or the published documents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvcast.lab.bench.processes import DaemonProcess, free_port, wait_until
from kvcast.lab.bench.soak import FAST_FLAGS
from tests.deploy.tools import DEPLOY

COMPOSE = DEPLOY / "compose" / "compose.yaml"
USER_TEXT = ("zebracorn", "Lisbon", "null check", "leeks", "quarterly", "German", "And then?")


def compose_commands() -> dict[str, list[str]]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {
        name: [*(service.get("entrypoint") or []), *(service.get("command") or [])]
        for name, service in services.items()
    }


def localized(command: list[str], addresses: dict[str, str]) -> list[str]:
    out = []
    for arg in command:
        for compose_name, local in addresses.items():
            arg = arg.replace(compose_name, local)
        out.append(arg)
    return out


def start(command: list[str], log: Path) -> subprocess.Popen:
    if command[0] == "python":
        command = [sys.executable, *command[1:]]
    else:  # the kvcast image's entry point
        command = [sys.executable, "-m", "kvcast.cli.main", *command]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def redis_text(client, namespace: str) -> str:
    """Every key and value of ``namespace``, whatever its type, as text."""
    parts = []
    for key in client.scan_iter(f"{namespace}*"):
        kind = client.type(key).decode()
        read = {
            "string": client.get,
            "hash": client.hgetall,
            "set": client.smembers,
            "zset": lambda k: client.zrange(k, 0, -1),
            "list": lambda k: client.lrange(k, 0, -1),
        }.get(kind)
        value: Any = read(key) if read is not None else b""
        parts.append(repr(key) + repr(value))
    return "\n".join(parts)


def sessions_on(bootstrap: str, topic: str, expected: int) -> dict[str, list[int]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000)  # fmt: skip
    turns: dict[str, list[int]] = defaultdict(list)
    raw: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while sum(map(len, turns.values())) < expected and time.monotonic() < deadline:
            for message in consumer:
                raw.append(message.value)
                event = json.loads(message.value)
                turns[event["session_id"]].append(event["turn"])
    finally:
        consumer.close()
    sessions_on.raw = raw  # type: ignore[attr-defined]
    return turns


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)  # one watermark for all chats
def test_chat_traffic_through_the_tap_reaches_the_table_without_user_text(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_client,
    redis_namespace: str,
) -> None:  # fmt: skip
    commands = compose_commands()
    engine, tap = free_port(), free_port()
    key = tmp_path / "hash.key"
    key.write_text(os.urandom(32).hex())
    addresses = {
        "0.0.0.0:8000": f"127.0.0.1:{engine}",
        "http://engine-standin:8000": f"http://127.0.0.1:{engine}",
        "0.0.0.0:8001": f"127.0.0.1:{tap}",
        "http://kvcast-tap:8001": f"http://127.0.0.1:{tap}",
        "kafka://kafka:9092/requests": f"kafka://{kafka_bootstrap}/{kafka_topic}",
        "/keys/hash.key": str(key),
        "/demo/chat_client.py": str(DEPLOY / "compose" / "chat_client.py"),
    }
    config = tmp_path / "kvcast.toml"
    config.write_text(
        (DEPLOY / "compose" / "kvcast.toml").read_text()
        .replace("kafka://kafka:9092/requests", f"kafka://{kafka_bootstrap}/{kafka_topic}")
        .replace('"0.0.0.0:9400"', '"127.0.0.1:0"')
    )  # fmt: skip
    processes = [
        start(localized(commands["engine-standin"], addresses), tmp_path / "engine.log"),
        start(localized(commands["kvcast-tap"], addresses), tmp_path / "tap.log"),
    ]
    run_args = localized(commands["kvcast"], {"/etc/kvcast/kvcast.toml": str(config)})[1:]
    env = {**os.environ, "KVCAST_STORE": redis_url}
    flags = [*run_args, "--namespace", redis_namespace, *FAST_FLAGS,
             "--completion-timeout", "5", "--allowed-lateness", "1"]  # fmt: skip
    daemon = DaemonProcess(flags, tmp_path / "daemon.log", env=env)
    try:
        client = localized(commands["chat-client"], addresses)
        client = [sys.executable, *client[1:]]
        finished: list[int] = []
        for phase, (count, seed) in enumerate([(24, 1), (4, 2)]):  # the 2nd moves time on
            if phase:
                time.sleep(8)  # past the completion timeout of every conversation of phase 1
            done = subprocess.run(
                [*client, "--conversations", str(count), "--think-s", "0.05", "--seed",
                 str(seed), "--wait-s", "30"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            report = json.loads(done.stdout.strip().splitlines()[-1])
            assert report["failures"] == []
            finished += report["turns"]

        turns = sessions_on(kafka_bootstrap, kafka_topic, sum(finished))
        # The conversations, recovered without a session id: same sizes, turns 1..k each.
        assert Counter(len(t) for t in turns.values()) == Counter(finished)
        assert all(sorted(t) == list(range(1, len(t) + 1)) for t in turns.values())

        seen: list[Any] = []

        def published() -> bool:
            table = daemon.get("/v1/table") if _ready(daemon) else {}
            seen.append(table.get("window_conversations"))
            return table.get("window_conversations", 0) >= 24

        try:
            wait_until(published, 60, "the table to count the first 24 conversations")
        except TimeoutError as exc:
            raise AssertionError(
                f"window_conversations: {seen[-5:]}\n{daemon.text()[-3000:]}"
            ) from exc
        table, forecast = daemon.get("/v1/table"), daemon.get("/v1/forecast")
        assert table["states"] and forecast["hit_ratio"] is not None
        assert forecast["observed_hit_ratio"] is not None  # the engine's cached_tokens

        everything = "\n".join([
            *(r.decode("utf-8", "replace") for r in sessions_on.raw),  # type: ignore[attr-defined]
            redis_text(redis_client, redis_namespace),
            daemon.text(), (tmp_path / "tap.log").read_text(errors="replace"),
            daemon.raw("/metrics").decode(), json.dumps(table), json.dumps(forecast),
        ])  # fmt: skip
        leaked = [text for text in USER_TEXT if text in everything]
        assert leaked == []
        assert daemon.stop() == 0
    finally:
        daemon.stop()
        for process in processes:
            process.terminate()
            process.wait(timeout=10)


def _ready(daemon: DaemonProcess) -> bool:
    import urllib.error

    try:
        daemon.raw("/v1/table")
        return True
    except urllib.error.HTTPError:
        return False
