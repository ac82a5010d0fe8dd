"""``kvcast table`` from a replay file, from a daemon's HTTP server and from Redis."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from kvcast.cli.main import cli
from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.exporters.http_server import HttpServer

TABLE = {
    "version": 3,
    "generated_at": 1234.5,
    "window_conversations": 42,
    "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
    "states": [
        {"intent": "coding", "turn": 2, "p_continue": 0.75, "median_reuse_s": 33.0, "mu": 3.5,
         "sigma": 0.4, "conversations": 20, "delay_samples": 15},
        {"intent": "coding", "turn": 1, "p_continue": 0.8, "median_reuse_s": 150.0, "mu": None,
         "sigma": None, "conversations": 25, "delay_samples": 0},
    ],
}  # fmt: skip


class State:
    def __init__(self, table: dict[str, Any] | None) -> None:
        self.table = table

    def forecast_document(self) -> None:
        return None

    def table_document(self) -> dict[str, Any] | None:
        return self.table

    def readiness(self) -> tuple[bool, dict[str, str]]:
        return True, {}

    def liveness(self) -> tuple[bool, str]:
        return True, "ok"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["table", *args], catch_exceptions=False)


def events(path: Path) -> Path:
    lines = []
    for session in range(6):
        start = session * 10.0
        for turn in (1, 2, 3)[: 1 + session % 3]:
            lines.append({"session_id": f"s{session}", "turn": turn, "intent": "coding",
                          "timestamp": start + 20.0 * turn, "input_tokens": 100 * turn,
                          "output_tokens": 10})  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_table_from_a_replay(tmp_path: Path) -> None:
    own = tmp_path / "intents.txt"  # "coding" is this deployment's own intent
    own.write_text("# added to the 30 categories\ncoding\n")
    taxonomy = ("--taxonomy-file", str(own))
    result = invoke("--replay", str(events(tmp_path / "e.jsonl")), *taxonomy, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    states = {(s["intent"], s["turn"]): s for s in doc["states"]}
    assert states[("coding", 1)]["conversations"] == 6
    assert states[("coding", 2)]["p_continue"] == pytest.approx(2 / 4)
    human = invoke("--replay", str(events(tmp_path / "e.jsonl")), *taxonomy)
    assert "3 states over 1 intents" in human.output
    assert "coding                          2      0.500" in human.output


def test_table_over_http_and_when_nothing_answers() -> None:
    server = HttpServer("127.0.0.1", 0, State(TABLE), CollectorRegistry())
    server.start()
    try:
        result = invoke("--http", server.url)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert lines[0] == f"priority table version 3 from {server.url}/v1/table"
        assert "1 without delay samples" in lines[2]
        rows = [line.split() for line in lines[6:]]
        assert [row[:4] for row in rows] == [["coding", "1", "0.800", "150.0"],
                                             ["coding", "2", "0.750", "33.0"]]  # fmt: skip
        assert json.loads(invoke("--http", server.url, "--json").output) == TABLE
    finally:
        server.close()
    result = invoke("--http", server.url)
    assert result.exit_code == 1 and "Connection refused" in result.output
    assert invoke("--http", server.url, "--redis", "redis://x").exit_code == 2


def test_table_from_redis(redis_url: str, redis_namespace: str) -> None:
    missing = invoke("--redis", redis_url, "--namespace", redis_namespace)
    assert missing.exit_code == 1 and "no table published yet" in missing.output
    store = RedisStore(redis_url, redis_namespace)
    store.publish_table(TABLE)
    store.close()
    result = invoke("--redis", redis_url, "--namespace", redis_namespace, "--json")
    assert result.exit_code == 0 and json.loads(result.output) == TABLE


def test_an_intent_outside_the_taxonomy_counts_as_unknown(tmp_path: Path) -> None:
    result = invoke("--replay", str(events(tmp_path / "e.jsonl")), "--json")
    assert {s["intent"] for s in json.loads(result.output)["states"]} == {"unknown"}
    bad = tmp_path / "bad.txt"
    bad.write_text("fine\nnot fine\n")
    refused = invoke("--replay", str(events(tmp_path / "e.jsonl")), "--taxonomy-file", str(bad))
    assert refused.exit_code == 2 and f"{bad}:2" in refused.output


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


@pytest.mark.parametrize("source", ["http", "redis"])
def test_with_nothing_listening_the_command_says_what_to_start(source: str) -> None:
    """The ``kvcast`` command as a user runs it, with no daemon (or no Redis) on the port: one
    line saying what did not answer and what to start, exit 1, no urllib or redis-py repr."""
    url = (
        f"http://127.0.0.1:{free_port()}"
        if source == "http"
        else f"redis://127.0.0.1:{free_port()}/0"
    )
    kvcast = Path(sys.executable).with_name("kvcast")
    done = subprocess.run(
        [str(kvcast), "table", f"--{source}", url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "Connection refused" in line and "<urlopen" not in line and "Traceback" not in line
    if source == "http":
        assert line.startswith(f"Error: no kvcast daemon answers at {url}/v1/table")
        assert "start one with `kvcast run`" in line
    else:
        assert line.startswith("Error: cannot read the table: the Redis of --redis is unreachable")
        assert "the --redis URL the daemon was started with" in line
