"""One contract for every engine-side table source: a file, HTTP and Redis (real servers).

Each source is opened through ``exporters.kit.client.open_source(URL)``, as :class:`TableClient`
opens it, over a document the test publishes itself: a JSON file it writes, a ``/v1/table``
served on a loopback port, or the namespace's table key in the real Redis. What differs by
design is declared in the fixture's parameters (:class:`Expected`).

The HTTP server is a stdlib one that answers like the daemon's ``/v1/table``
(``exporters/http_pages.table``: 503 before the first table, ``ETag: "<version>"``, 304 on
``If-None-Match``) but serves any bytes: the daemon's own server only ever sends well-formed
objects, and the contract covers malformed answers too.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kvcast.exporters.kit.client import TableClient, TableSource, TableSourceError, open_source
from kvcast.lab.bench.processes import free_port
from kvcast.stats.store_url import table_key


def table(version: int, p_continue: float = 0.9) -> dict[str, Any]:
    """A table document the client accepts (SPEC section 5)."""
    return {
        "version": version,
        "generated_at": 1000.0 + version,
        "window_conversations": 10,
        "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
        "states": [
            {"intent": "coding", "turn": 1, "p_continue": p_continue, "median_reuse_s": 60.0,
             "mu": 4.1, "sigma": 0.5, "conversations": 10, "delay_samples": 9},
        ],
    }  # fmt: skip


def encode(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc).encode()


class TableServer:
    """``GET /v1/table`` on 127.0.0.1 (a port picked by the OS), answering like the daemon."""

    def __init__(self) -> None:
        self.published: tuple[bytes, str | None] | None = None  # (body, ETag)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if urlsplit(self.path).path != "/v1/table":
                    self._reply(404, b'{"error": "not found"}')
                elif owner.published is None:
                    self._reply(503, b'{"status": "warming_up"}')
                else:
                    body, etag = owner.published
                    if etag is not None and self.headers.get("If-None-Match") == etag:
                        self._reply(304, None, etag)
                    else:
                        self._reply(200, body, etag)

            def _reply(self, status: int, body: bytes | None, etag: str | None = None) -> None:
                self.send_response(status)
                if etag is not None:
                    self.send_header("ETag", etag)
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body is not None:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self._stopped = False
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1/table"

    def publish(self, body: bytes) -> None:
        try:
            version = json.loads(body).get("version")
        except (ValueError, AttributeError, RecursionError):
            version = None
        is_int = isinstance(version, int) and not isinstance(version, bool)
        self.published = (body, f'"{version}"' if is_int else None)

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=2)


class BrokenPeer:
    """A TCP listener on 127.0.0.1 that reads what a client sends, answers ``reply`` (bytes that
    are no proper answer of the source's protocol) and closes."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            with connection, contextlib.suppress(OSError):
                connection.settimeout(1.0)
                connection.recv(65536)
                connection.sendall(self.reply)
                connection.shutdown(socket.SHUT_WR)
                while connection.recv(65536):  # let the client finish before closing
                    pass

    def close(self) -> None:
        self._listener.close()


@dataclass(frozen=True)
class Expected:
    """What differs between implementations by design."""

    # What fetch gives before anything was published: None, or TableSourceError for a file
    # (a file not written yet cannot be told from a removed one).
    before_publish: type[TableSourceError] | None


class Backend:
    """Publishes documents to where ``source`` reads them."""

    expected: Expected
    source: TableSource
    where: str  # what an error about a malformed document names
    others: list[TableSource]  # further sources a test opened, closed with the backend

    def publish(self, doc: Mapping[str, Any]) -> None:
        self.publish_raw(encode(doc))

    def publish_raw(self, raw: bytes) -> None:
        raise NotImplementedError

    def cut_off(self) -> TableSource:
        """A source of this kind whose document can no longer be reached."""
        raise NotImplementedError

    def answered_by(self, peer: BrokenPeer) -> TableSource:
        """A source of this kind whose location answers, but not with a readable document."""
        raise NotImplementedError

    def close(self) -> None:
        self.source.close()
        for source in self.others:
            source.close()


class FileBackend(Backend):
    def __init__(self, directory: Path, expected: Expected) -> None:
        self.expected = expected
        self.path = directory / "table.json"
        self.source = open_source(self.path.as_uri())
        self.where = str(self.path)
        self.others = []
        self._mtime: int | None = None

    def publish_raw(self, raw: bytes) -> None:
        self.path.write_bytes(raw)
        # The source notices a new document by its mtime. Where file timestamps are coarse (a
        # clock tick, a second on some filesystems) two writes in a row can share one: move it
        # on, as a later write would, so that this suite tests the same thing everywhere.
        mtime = self.path.stat().st_mtime_ns
        if self._mtime is not None and mtime <= self._mtime:
            mtime = self._mtime + 1000
            os.utime(self.path, ns=(mtime, mtime))
        self._mtime = mtime

    def cut_off(self) -> TableSource:
        self.path.unlink()
        return self.source

    def answered_by(self, peer: BrokenPeer) -> TableSource:
        """No peer for a file: a directory stands where the file should be."""
        directory = self.path.with_name(f"directory-{peer.port}.json")
        directory.mkdir()
        self.others.append(open_source(directory.as_uri()))
        return self.others[-1]


class HttpBackend(Backend):
    def __init__(self, expected: Expected) -> None:
        self.expected = expected
        self.server = TableServer()
        self.source = open_source(self.server.url, timeout_s=2.0)
        self.where = self.server.url
        self.others = []

    def publish_raw(self, raw: bytes) -> None:
        self.server.publish(raw)

    def cut_off(self) -> TableSource:
        self.server.stop()
        return self.source

    def answered_by(self, peer: BrokenPeer) -> TableSource:
        self.others.append(open_source(f"http://127.0.0.1:{peer.port}/v1/table", timeout_s=1.0))
        return self.others[-1]

    def close(self) -> None:
        super().close()
        self.server.stop()


class RedisBackend(Backend):
    """The table key in a real Redis: one server, a Redis Cluster or the master behind a
    Sentinel (``scheme`` is the URL scheme of the sources opened on an unreachable port)."""

    def __init__(
        self, client: Any, url: str, namespace: str, expected: Expected, scheme: str = "redis"
    ) -> None:
        self.expected = expected
        self.client, self.namespace, self.scheme = client, namespace, scheme
        self.source = open_source(url, namespace=namespace, timeout_s=2.0)
        self.where = table_key(namespace)
        self.others = []

    def publish_raw(self, raw: bytes) -> None:
        self.client.set(table_key(self.namespace), raw)

    def cut_off(self) -> TableSource:
        """The shared Redis stays up: a source of the namespace on a port nothing listens on."""
        return self._at(free_port())

    def answered_by(self, peer: BrokenPeer) -> TableSource:
        return self._at(peer.port)

    def _at(self, port: int) -> TableSource:
        url = {
            "redis": f"redis://127.0.0.1:{port}/0",
            "redis+cluster": f"redis+cluster://127.0.0.1:{port}",
            "redis+sentinel": f"redis+sentinel://127.0.0.1:{port}/kvcast",
        }[self.scheme]
        self.others.append(open_source(url, namespace=self.namespace, timeout_s=1.0))
        return self.others[-1]


IMPLEMENTATIONS = [
    pytest.param(("file", Expected(before_publish=TableSourceError)), id="file"),
    pytest.param(("http", Expected(before_publish=None)), id="http"),
    pytest.param(
        ("redis", Expected(before_publish=None)), id="redis", marks=pytest.mark.integration
    ),
    pytest.param(
        ("cluster", Expected(before_publish=None)), id="cluster", marks=pytest.mark.integration
    ),
    pytest.param(
        ("sentinel", Expected(before_publish=None)), id="sentinel", marks=pytest.mark.integration
    ),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind, expected = request.param
    if kind == "file":
        chosen: Backend = FileBackend(tmp_path, expected)
    elif kind == "http":
        chosen = HttpBackend(expected)
    elif kind == "cluster":
        import redis

        cluster = request.getfixturevalue("redis_cluster")
        nodes = [redis.cluster.ClusterNode("127.0.0.1", port) for port in cluster.ports]
        chosen = RedisBackend(
            redis.RedisCluster(startup_nodes=nodes),
            cluster.url,
            request.getfixturevalue("redis_cluster_namespace"),
            expected,
            "redis+cluster",
        )
    elif kind == "sentinel":
        sentinel = request.getfixturevalue("redis_sentinel")
        chosen = RedisBackend(
            sentinel.client(sentinel.master_port()),
            sentinel.url,
            request.getfixturevalue("redis_sentinel_namespace"),
            expected,
            "redis+sentinel",
        )
    else:
        chosen = RedisBackend(
            request.getfixturevalue("redis_client"),
            request.getfixturevalue("redis_url"),
            request.getfixturevalue("redis_namespace"),
            expected,
        )
    yield chosen
    chosen.close()


def outcome(fetch: Callable[[], Mapping[str, Any] | None]) -> Any:
    """What ``fetch()`` returned, or TableSourceError when it raised that."""
    try:
        return fetch()
    except TableSourceError:
        return TableSourceError


# -- the contract ------------------------------------------------------------------------------


def test_before_anything_is_published_fetch_answers_none_where_the_source_can_tell(
    backend: Backend,
) -> None:
    """HTTP (503 warming up) and Redis (no key) answer None; a file that was never written
    raises TableSourceError, as the fixture declares."""
    assert outcome(backend.source.fetch) is backend.expected.before_publish
    assert outcome(backend.source.fetch) is backend.expected.before_publish


def test_a_published_document_comes_back_equal(backend: Backend) -> None:
    """fetch returns the published document as a JSON object equal to it."""
    backend.publish(table(1))
    assert backend.source.fetch() == table(1)


def test_an_unchanged_document_answers_none_on_the_next_fetches(backend: Backend) -> None:
    """Once fetched, the same document is not handed out again (a 304, the same bytes, the
    same mtime): fetch answers None as long as nothing new was published."""
    backend.publish(table(1))
    assert backend.source.fetch() == table(1)
    assert backend.source.fetch() is None
    assert backend.source.fetch() is None


def test_a_newer_document_comes_back_once(backend: Backend) -> None:
    """A document published after the last fetch is handed out by the next fetch, then None."""
    backend.publish(table(1))
    assert backend.source.fetch() == table(1)
    backend.publish(table(2, p_continue=0.4))
    assert backend.source.fetch() == table(2, p_continue=0.4)
    assert backend.source.fetch() is None
    backend.publish(table(3))
    assert backend.source.fetch() == table(3)


@pytest.mark.parametrize(
    "raw",
    [b"not json {", b"[1, 2, 3]", b'"a table"', b"null", b"", b"\xff\xfe\x00", b"[" * 1000],
    ids=["not-json", "array", "string", "null", "empty", "not-utf8", "nested-1000-deep"],
)
def test_a_malformed_document_raises_table_source_error_naming_where_until_replaced(
    backend: Backend, raw: bytes
) -> None:
    """Not JSON, or JSON that is not an object: TableSourceError whose message names the file,
    the URL or the Redis key, on every fetch (never taken for "unchanged"); the next good
    document comes back."""
    backend.publish(table(1))
    assert backend.source.fetch() == table(1)
    backend.publish_raw(raw)
    for _ in range(2):
        with pytest.raises(TableSourceError) as raised:
            backend.source.fetch()
        assert backend.where in str(raised.value)
    backend.publish(table(2))
    assert backend.source.fetch() == table(2)


def test_an_unreachable_source_raises_table_source_error_and_nothing_else(
    backend: Backend,
) -> None:
    """A removed file, a stopped server, a Redis port with nothing listening: fetch raises
    TableSourceError (pytest.raises lets any other exception type fail the test), each time."""
    backend.publish(table(1))
    assert backend.source.fetch() == table(1)
    source = backend.cut_off()
    for _ in range(2):
        with pytest.raises(TableSourceError) as raised:
            source.fetch()
        assert str(raised.value)


@pytest.mark.parametrize(
    "reply",
    [b"\x00\x01 garbage\r\n", b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"version": 1', b""],
    ids=["garbage", "cut-off-reply", "closed-at-once"],
)
def test_a_location_that_answers_without_a_document_raises_table_source_error(
    backend: Backend, reply: bytes
) -> None:
    """A peer that breaks the protocol (a non-HTTP or non-Redis service on the port, a reply
    cut off mid-body, a connection closed unanswered), or a directory where the file should
    be: TableSourceError, so that TableClient.refresh keeps its table instead of raising."""
    peer = BrokenPeer(reply)
    try:
        source = backend.answered_by(peer)
        with pytest.raises(TableSourceError):
            source.fetch()
        client = TableClient(source, refresh_s=60)
        assert client.refresh() is False and client.last_error
    finally:
        peer.close()


def test_close_may_be_called_again(backend: Backend) -> None:
    """close() after use, and once more (the fixture closes the source a third time)."""
    backend.publish(table(1))
    assert backend.source.fetch() == table(1)
    backend.source.close()
    backend.source.close()


def test_a_table_client_over_the_source_swaps_in_each_new_table_once(backend: Backend) -> None:
    """TableClient.refresh on the source: the defaults until a table is published, then each
    newer version swapped in once; an unchanged source swaps nothing and reports no error."""
    client = TableClient(backend.source, refresh_s=60)
    assert client.refresh() is False and client.version is None
    backend.publish(table(3))
    assert client.refresh() is True and client.version == 3
    assert client.refresh() is False and client.version == 3 and client.last_error is None
    backend.publish(table(4, p_continue=0.3))
    assert client.refresh() is True and client.version == 4
    assert client.priority("coding", 1, age_s=1.0, size_tokens=8) == client.index.priority(
        "coding", 1, 1.0, 8
    )
    client.close()
