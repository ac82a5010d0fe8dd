"""The engine-side client against real sources: the daemon's HTTP server and Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.exporters.http_server import HttpServer
from kvcast.exporters.kit.client import (
    FileTableSource,
    HttpTableSource,
    TableClient,
    open_source,
)
from kvcast.stats.store_url import table_key


def doc(version: int, p: float = 0.9, median_s: float = 60.0) -> dict[str, Any]:
    return {
        "version": version,
        "generated_at": 1000.0 + version,
        "window_conversations": 10,
        "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
        "states": [
            {"intent": "coding", "turn": 1, "p_continue": p, "median_reuse_s": median_s,
             "mu": 4.1, "sigma": 0.5, "conversations": 10, "delay_samples": 9},
        ],
    }  # fmt: skip


@dataclass
class TableState:
    """A PublishedState serving whatever table the test sets."""

    table: dict[str, Any] | None = None

    def forecast_document(self) -> dict[str, Any] | None:
        return None

    def table_document(self) -> dict[str, Any] | None:
        return self.table

    def readiness(self) -> tuple[bool, dict[str, str]]:
        return True, {}

    def liveness(self) -> tuple[bool, str]:
        return True, "ok"


@pytest.fixture
def served():
    state = TableState()
    server = HttpServer("127.0.0.1", 0, state, CollectorRegistry())
    server.start()
    yield state, server
    server.close()


BLOCKED = ("torch", "kafka", "numpy", "scipy", "redis", "orjson", "prometheus_client", "click",
           "kvcast.daemon", "kvcast.stats", "kvcast.classifier",
           "kvcast.lab", "kvcast.cli")  # fmt: skip
# The stats modules the engine kit may import (tests/test_architecture.py's KIT_STATS, which
# holds them to the standard library at import time): the store URL grammar and key layout.
ALLOWED = ("kvcast.stats", "kvcast.stats.store_url")


def test_client_imports_without_heavy_or_daemon_modules(tmp_path: Path) -> None:
    """A meta-path hook refuses the forbidden modules; the client still loads and ranks."""
    table_file = tmp_path / "table.json"
    table_file.write_text(json.dumps(doc(3)))
    script = textwrap.dedent(f"""
        import sys
        BLOCKED = {BLOCKED!r}
        ALLOWED = {ALLOWED!r}
        def blocked(name):
            return name not in ALLOWED and any(
                name == b or name.startswith(b + ".") for b in BLOCKED
            )
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if blocked(name):
                    raise ImportError("blocked in this test: " + name)
                return None
        sys.meta_path.insert(0, Refuse())
        from kvcast.exporters.kit.client import TableClient
        from kvcast.exporters.kit.adapters import IACStrategy, IACFreeBlockQueue
        client = TableClient({str(table_file)!r}, refresh_s=60)
        client.refresh()
        print(client.version, client.priority("coding", 1, 10.0, 64))
        loaded = sorted(m for m in sys.modules if blocked(m))
        print(loaded)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["3 (1, 0.9, 64)", "[]"]


def test_http_source_uses_the_etag(served) -> None:
    state, server = served
    state.table = doc(1)
    source = HttpTableSource(server.url)  # a bare base URL gets /v1/table
    assert source.url == server.url + "/v1/table"
    assert source.fetch()["version"] == 1
    assert source.fetch() is None  # If-None-Match: "1" -> 304, nothing parsed
    request = urllib.request.Request(source.url, headers={"If-None-Match": '"1"'})
    with pytest.raises(urllib.error.HTTPError) as reply:
        urllib.request.urlopen(request, timeout=5)
    assert reply.value.code == 304
    reply.value.close()
    state.table = doc(2)
    assert source.fetch()["version"] == 2


def test_client_over_http_follows_versions_and_survives_the_server(served) -> None:
    state, server = served
    client = TableClient(server.url + "/v1/table", refresh_s=60)
    assert client.refresh() is False  # 503 warming up: defaults, and not an error
    assert (client.version, client.last_error) == (None, None)
    assert client.priority("coding", 1, 10.0, 64) == (1, 0.5, 64)
    state.table = doc(1)
    assert client.refresh() is True
    assert client.priority("coding", 1, 10.0, 64) == (1, 0.9, 64)
    assert client.refresh() is False and client.loads == 1  # 304
    state.table = doc(2, p=0.1)
    assert client.refresh() is True
    assert (client.version, client.priority("coding", 1, 10.0, 64)) == (2, (1, 0.1, 64))
    server.close()
    assert client.refresh() is False
    assert client.version == 2 and "Connection refused" in client.last_error
    assert client.priority("coding", 1, 10.0, 64) == (1, 0.1, 64)
    assert client.status()["version"] == 2


def test_a_malformed_table_keeps_the_last_good_one_and_stays_reported(served) -> None:
    state, server = served
    client = TableClient(server.url, refresh_s=60)
    state.table = doc(1)
    client.refresh()
    state.table = {
        **doc(2),
        "states": [{"intent": "coding", "turn": 1, "p_continue": 7, "median_reuse_s": 9}],
    }
    assert client.refresh() is False
    assert client.version == 1 and "p_continue" in client.last_error
    assert client.refresh() is False  # 304 for the same bad version: still reported
    assert client.last_error is not None
    state.table = doc(3)
    assert client.refresh() is True and client.last_error is None


def test_a_client_that_never_loaded_answers_with_the_defaults() -> None:
    client = TableClient("http://127.0.0.1:9/v1/table", refresh_s=0.05, timeout_s=0.5)
    with client:
        time.sleep(0.2)
        assert client.priority("coding", 1, 151.0, 8) == (0, 0.5, 8)
        assert client.version is None and client.last_error


def test_file_source_reads_a_table_or_a_replay_result(tmp_path: Path) -> None:
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"forecast": {}, "table": doc(5), "events": {}}))
    source = open_source(str(path))
    assert isinstance(source, FileTableSource)
    assert source.fetch()["version"] == 5
    assert source.fetch() is None  # unchanged file
    with pytest.raises(ValueError, match="unsupported"):
        open_source("ftp://example/table")


def test_redis_key_matches_the_store(redis_url: str, redis_namespace: str) -> None:
    store = RedisStore(redis_url, redis_namespace)
    assert table_key(redis_namespace) == store.key("table")
    client = TableClient(redis_url, namespace=redis_namespace, refresh_s=60)
    assert client.refresh() is False and client.last_error is None  # nothing published yet
    store.publish_table(doc(1))
    assert client.refresh() is True and client.version == 1
    assert client.refresh() is False  # same bytes: not parsed again
    store.publish_table(doc(2, median_s=5.0))
    assert client.refresh() is True
    assert client.priority("coding", 1, 10.0, 64) == (0, 0.9, 64)
    client.close()
    store.close()


def test_the_clients_policy_is_what_priority_and_rank_use(tmp_path: Path) -> None:
    table_file = tmp_path / "table.json"
    table_file.write_text(json.dumps({**doc(2), "characteristic_time_s": 240.0}))
    iac = TableClient(str(table_file), refresh_s=60)
    density = TableClient(str(table_file), refresh_s=60, policy="density")
    for client in (iac, density):
        client.refresh()
    assert density.index.horizon_s == 240.0
    nodes = [("coding", 1, 10.0, 64), ("coding", 1, 5000.0, 64), ("chat", 2, 30.0, 16)]
    for intent, turn, age, size in nodes:
        assert iac.priority(intent, turn, age, size) == iac.index.priority(intent, turn, age, size)
        assert density.priority(intent, turn, age, size) == density.index.priority(
            intent, turn, age, size, policy="density"
        )
        assert iac.priority(intent, turn, age, size, policy="density") == density.priority(
            intent, turn, age, size
        )
    keys = [density.priority(*node) for node in nodes]
    assert density.rank(nodes) == iac.rank(nodes, policy="density")
    assert density.rank(nodes) == sorted(range(3), key=keys.__getitem__)
    assert density.rank(nodes)[0] == 1  # the block 5,000 s past a 60 s median goes first
    assert iac.rank(nodes) == density.rank(nodes, policy="iac")
    with pytest.raises(ValueError, match="policy"):
        TableClient(str(table_file), policy="lru")


def test_a_shared_block_ranks_by_the_tables_shared_law(tmp_path: Path) -> None:
    """``SHARED_INTENT`` under density: the table's ``shared`` law (a prompt reused every
    second outranks a conversation's block at the same age), the defaults without one; the
    rankings of many candidates take it as the single priorities do."""
    from kvcast.exporters.kit.client import SHARED_INTENT
    from kvcast.exporters.kit.density import DensityCurve
    from kvcast.exporters.kit.laws import smoothed_p

    law = {"p_continue": 0.98, "median_reuse_s": 1.0, "mu": 0.0, "sigma": 1.0,
           "references": 4900, "lives": 100}  # fmt: skip
    table_file = tmp_path / "table.json"
    table_file.write_text(json.dumps({**doc(2), "characteristic_time_s": 240.0, "shared": law}))
    client = TableClient(str(table_file), refresh_s=60, policy="density")
    client.refresh()
    curve = DensityCurve(smoothed_p(0.98, 5000), 0.0, 1.0, 240.0)
    assert client.priority(SHARED_INTENT, 3, 2.0, 4) == (curve.at(2.0) / 4, -2.0)
    nodes = [("coding", 1, 2.0, 4), (SHARED_INTENT, 1, 2.0, 4), (SHARED_INTENT, 1, 9e4, 4)]
    assert client.rank(nodes) == [2, 0, 1]  # a dead prompt, a conversation, a live prompt
    table_file.write_text(json.dumps({**doc(3), "characteristic_time_s": 240.0}))
    client.refresh()
    assert client.priority(SHARED_INTENT, 1, 2.0, 4) == client.priority("unlisted", 1, 2.0, 4)
