"""``kvcast run`` against a Kafka broker that is not there yet (the first hour, issue 35 item 7):
the HTTP server comes up without it, ``/readyz`` and kvcast's own log line say the broker is
unreachable and why, SIGTERM drains and exits 0 with its "stopped" line; and when a broker
starts on that address, the same process consumes from it."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from pathlib import Path

import orjson
from kafka.admin import KafkaAdminClient, NewTopic

from kvcast.daemon.sources.kafka_source import _host_port, probe_bootstrap
from kvcast.lab.bench.processes import DaemonProcess, free_port, wait_until
from kvcast.lab.bench.soak import FAST_FLAGS
from tests.services import listening, tansu_binary
from tests.support import VALID, produce, readiness

STOPPED = re.compile(r"kvcast: stopped on SIGTERM: ([\d,]+) events applied, everything stored")


def test_without_a_broker_http_answers_readyz_says_why_and_sigterm_exits_0(tmp_path: Path) -> None:
    port = free_port()  # nothing listens on it during the whole test
    daemon = DaemonProcess(
        ["--source", f"kafka://127.0.0.1:{port}/events", *FAST_FLAGS], tmp_path / "daemon.log",
        start_timeout=25,  # kafka-python alone waits 30 s for a bootstrap, then raises
    )  # fmt: skip
    try:
        wait_until(lambda: "unreachable" in readiness(daemon)[1]["components"]["source"], 20,
                   "/readyz to name the broker")  # fmt: skip
        status, body = readiness(daemon)
        assert status == 503 and body["status"] == "not_ready"
        assert body["components"]["source"].startswith(f"kafka broker 127.0.0.1:{port} unreachable")
        assert "connection refused" in body["components"]["source"]
        assert re.search(
            rf"WARNING kvcast\.daemon\.sources\.kafka_source: kafka broker 127\.0\.0\.1:{port}"
            rf" unreachable \(127\.0\.0\.1:{port}: connection refused\)",
            daemon.text(),
        ), daemon.text()
        assert "kafka.net" not in daemon.text()  # no kafka-python reconnect lines while refused
    finally:
        code = daemon.stop(signal.SIGTERM)
    assert code == 0, daemon.text()
    assert STOPPED.search(daemon.text()), daemon.text()


def test_a_broker_that_starts_later_is_consumed_by_the_same_process(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    daemon = DaemonProcess(
        ["--source", f"kafka://{address}/events", *FAST_FLAGS], tmp_path / "daemon.log",
        start_timeout=25,
    )  # fmt: skip
    broker = None
    try:
        wait_until(lambda: "unreachable" in readiness(daemon)[1]["components"]["source"], 20,
                   "/readyz to name the broker")  # fmt: skip
        broker = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", f"tcp://{address}",
             "--advertised-listener-url", f"tcp://{address}", "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(lambda: listening(port), 10, "the broker to listen")
        admin = KafkaAdminClient(bootstrap_servers=address)
        admin.create_topics([NewTopic("events", 2, 1)])
        admin.close()
        lines = [
            orjson.dumps({**VALID, "session_id": f"s{n}", "turn": 1, "timestamp": 1000.0 + n})
            for n in range(50)
        ]
        produce(address, "events", lines, [])
        wait_until(lambda: readiness(daemon)[0] == 200, 60, "the daemon to become ready")
        wait_until(lambda: daemon.get("/v1/status")["processed"] == 50, 60,
                   "the 50 events to be consumed")  # fmt: skip
        assert "answers now: consuming events" in daemon.text()
    finally:
        code = daemon.stop(signal.SIGTERM)
        if broker is not None:
            broker.kill()
            broker.wait()
    assert code == 0, daemon.text()
    stopped = STOPPED.search(daemon.text())
    assert stopped and stopped.group(1) == "50", daemon.text()


def test_the_probe_reads_every_bootstrap_form_and_says_why_none_answered() -> None:
    assert _host_port("kafka-0:9093") == ("kafka-0", 9093)
    assert _host_port("[::1]:9093") == ("::1", 9093)
    assert _host_port("[::1]") == ("::1", 9092)
    assert _host_port("kafka-0") == ("kafka-0", 9092)
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    assert probe_bootstrap(dead) == "; ".join(f"{d}: connection refused" for d in dead)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        alive = f"127.0.0.1:{listener.getsockname()[1]}"
        assert probe_bootstrap([dead[0], alive]) is None  # one answering is enough
