"""The daemon's HTTP server, through real requests against a port picked by the OS."""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from kvcast.exporters.http_server import HttpServer


@dataclass
class FakeState:
    """A PublishedState whose answers the test sets; ``broken`` makes every method raise."""

    forecast: dict[str, Any] | None = None
    table: dict[str, Any] | None = None
    ready: tuple[bool, dict[str, str]] = (True, {"store": "ok", "source": "ok"})
    alive: tuple[bool, str] = (True, "heartbeat 0.1 s ago")
    broken: bool = False
    calls: int = field(default=0)

    def _check(self) -> None:
        self.calls += 1
        if self.broken:
            raise RuntimeError("state exploded")

    def forecast_document(self) -> dict[str, Any] | None:
        self._check()
        return self.forecast

    def table_document(self) -> dict[str, Any] | None:
        self._check()
        return self.table

    def readiness(self) -> tuple[bool, dict[str, str]]:
        self._check()
        return self.ready

    def liveness(self) -> tuple[bool, str]:
        self._check()
        return self.alive


@dataclass
class Reply:
    status: int
    headers: Any
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def fetch(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, data: bytes | None = None
) -> Reply:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        with error:
            return Reply(error.code, error.headers, error.read())


def raw(port: int, payload: bytes) -> bytes:
    """Send bytes on a bare socket and read the reply until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


TABLE = {
    "version": 7,
    "generated_at": 1234.5,
    "window_conversations": 100,
    "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
    "states": [{"intent": "coding", "turn": 1, "p_continue": 0.8, "median_reuse_s": 30.0}],
}
FORECAST = {"hit_ratio": 0.42, "upper_bound": 0.6, "curve": [[1000, 0.2], [2000, 0.42]]}


@pytest.fixture
def state() -> FakeState:
    return FakeState()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("kvcast_table_version", "Version of the published table.", registry=registry).set(7)
    return registry


@pytest.fixture
def server(state: FakeState, registry: CollectorRegistry) -> Iterator[HttpServer]:
    server = HttpServer("127.0.0.1", 0, state, registry)
    server.start()
    yield server
    server.close()


def test_port_and_url_come_from_the_bound_socket(server: HttpServer) -> None:
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


def test_healthz_follows_liveness(server: HttpServer, state: FakeState) -> None:
    reply = fetch(server.url + "/healthz")
    assert (reply.status, reply.json()) == (200, {"status": "ok"})
    assert reply.headers["Content-Type"] == "application/json"
    state.alive = (False, "no heartbeat for 42 s")
    reply = fetch(server.url + "/healthz")
    assert reply.status == 503
    assert reply.json() == {"status": "stuck", "reason": "no heartbeat for 42 s"}


def test_readyz_lists_components(server: HttpServer, state: FakeState) -> None:
    reply = fetch(server.url + "/readyz")
    assert reply.status == 200
    assert reply.json() == {"status": "ready", "components": {"store": "ok", "source": "ok"}}
    state.ready = (False, {"store": "redis unreachable", "source": "ok"})
    reply = fetch(server.url + "/readyz")
    assert reply.status == 503
    assert reply.json()["components"]["store"] == "redis unreachable"


def test_forecast_warms_up_then_serves_the_curve(server: HttpServer, state: FakeState) -> None:
    reply = fetch(server.url + "/v1/forecast")
    assert (reply.status, reply.json()) == (503, {"status": "warming_up"})
    state.forecast = {**FORECAST, "numpy": np.float64(0.25), "array": np.arange(3)}
    reply = fetch(server.url + "/v1/forecast")
    assert reply.status == 200
    assert reply.json() == {**FORECAST, "numpy": 0.25, "array": [0, 1, 2]}


def test_pretty_indents_and_other_query_strings_are_ignored(
    server: HttpServer, state: FakeState
) -> None:
    state.forecast = FORECAST
    plain = fetch(server.url + "/v1/forecast?unknown=1")
    pretty = fetch(server.url + "/v1/forecast/?pretty")
    assert b"\n" not in plain.body and b"\n  " in pretty.body
    assert plain.json() == pretty.json() == FORECAST


def test_table_etag_and_not_modified(server: HttpServer, state: FakeState) -> None:
    url = server.url + "/v1/table"
    assert (fetch(url).status, fetch(url).json()) == (503, {"status": "warming_up"})
    state.table = TABLE
    first = fetch(url)
    assert (first.status, first.json()) == (200, TABLE)
    assert first.headers["ETag"] == '"7"'
    assert first.headers["Cache-Control"] == "no-cache"

    cached = fetch(url, headers={"If-None-Match": '"7"'})
    assert (cached.status, cached.body) == (304, b"")
    assert cached.headers["ETag"] == '"7"'
    for header in ('W/"7"', '"5", "7"', "*"):
        assert fetch(url, headers={"If-None-Match": header}).status == 304

    state.table = {**TABLE, "version": 8}
    changed = fetch(url, headers={"If-None-Match": '"7"'})
    assert changed.status == 200 and changed.headers["ETag"] == '"8"'
    assert changed.json()["version"] == 8


def test_head_sends_headers_without_body(server: HttpServer, state: FakeState) -> None:
    state.table = TABLE
    get, head = fetch(server.url + "/v1/table"), fetch(server.url + "/v1/table", "HEAD")
    assert (head.status, head.body) == (200, b"")
    assert head.headers["ETag"] == get.headers["ETag"]
    assert head.headers["Content-Length"] == str(len(get.body))


def test_unknown_path_names_the_alternatives_without_echoing(server: HttpServer) -> None:
    reply = fetch(server.url + "/v1/tabel-SECRET")
    assert reply.status == 404
    doc = reply.json()
    assert doc["did_you_mean"][0] == "/v1/table"
    assert doc["paths"] == [
        "/healthz",
        "/metrics",
        "/readyz",
        "/v1/forecast",
        "/v1/status",
        "/v1/table",
    ]
    assert b"SECRET" not in reply.body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_are_not_allowed(server: HttpServer, state: FakeState, method: str) -> None:
    reply = fetch(server.url + "/v1/table", method, data=b'{"SECRET": 1}')
    assert reply.status == 405
    assert reply.headers["Allow"] == "GET, HEAD"
    assert b"SECRET" not in reply.body
    assert state.calls == 0


def test_malformed_requests_get_json_without_echo(server: HttpServer) -> None:
    bad = raw(server.port, b"GET /healthz SECRET/9.9\r\n\r\n")
    assert bad.startswith(b"HTTP/1.0 400") and b"application/json" in bad
    assert b"SECRET" not in bad
    unknown = raw(server.port, b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert unknown.startswith(b"HTTP/1.0 501") and b"Allow: GET, HEAD" in unknown


def test_metrics_come_from_the_given_registry_only(server: HttpServer) -> None:
    reply = fetch(server.url + "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4  # what a plain scrape gets
    assert b"kvcast_table_version 7.0" in reply.body
    assert b"python_info" not in reply.body  # the global default registry holds this one
    open_metrics = fetch(
        server.url + "/metrics", headers={"Accept": "application/openmetrics-text"}
    )
    assert open_metrics.headers["Content-Type"].startswith("application/openmetrics-text")
    assert open_metrics.body.endswith(b"# EOF\n")
    latest = fetch(server.url + "/metrics", headers={"Accept": "text/plain; version=1.0.0"})
    assert latest.headers["Content-Type"].startswith(CONTENT_TYPE_LATEST)


def test_a_raising_state_gives_500_and_the_server_lives_on(
    server: HttpServer, state: FakeState, caplog: pytest.LogCaptureFixture
) -> None:
    state.broken = True
    with caplog.at_level(logging.ERROR, logger="kvcast.exporters.http_server"):
        for path in ("/healthz", "/readyz", "/v1/forecast", "/v1/table"):
            reply = fetch(server.url + path)
            assert (reply.status, reply.json()) == (500, {"error": "internal"})
            assert b"exploded" not in reply.body
    assert any("state exploded" in (r.exc_text or "") for r in caplog.records)
    state.broken = False
    assert fetch(server.url + "/healthz").status == 200


def test_concurrent_requests_all_succeed(server: HttpServer, state: FakeState) -> None:
    state.table, state.forecast = TABLE, FORECAST
    paths = ["/healthz", "/readyz", "/v1/forecast", "/v1/table", "/metrics"] * 20
    with ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(lambda path: fetch(server.url + path).status, paths))
    assert statuses == [200] * len(paths)


def test_close_is_quick_idempotent_and_frees_the_port(
    state: FakeState, registry: CollectorRegistry
) -> None:
    first = HttpServer("127.0.0.1", 0, state, registry)
    first.start()
    port = first.port
    assert fetch(first.url + "/healthz").status == 200
    started = time.monotonic()
    first.close()
    first.close()
    assert time.monotonic() - started < 1.0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(first.url + "/healthz", timeout=2)

    second = HttpServer("127.0.0.1", port, state, registry)
    second.start()
    try:
        assert second.port == port
        assert fetch(second.url + "/healthz").status == 200
    finally:
        second.close()
    assert not [t for t in threading.enumerate() if t.name == f"kvcast-http-{port}"]


def test_close_before_start_and_start_twice(state: FakeState, registry: CollectorRegistry) -> None:
    never = HttpServer("127.0.0.1", 0, state, registry)
    never.close()
    with pytest.raises(RuntimeError):
        never.start()
    server = HttpServer("127.0.0.1", 0, state, registry)
    server.start()
    try:
        with pytest.raises(RuntimeError):
            server.start()
    finally:
        server.close()
