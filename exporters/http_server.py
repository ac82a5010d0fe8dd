"""The daemon's HTTP server: stdlib ``http.server``, one daemon thread per connection.

Endpoints (GET and HEAD): ``/`` (the status page), ``/healthz``, ``/readyz``, ``/v1/forecast``,
``/v1/table``, ``/v1/status`` and ``/metrics``; the pages themselves live in
:mod:`kvcast.exporters.http_pages`.

Clients cannot hold it: a request (its line and headers, or the wait for the next request on a
kept-alive connection) must arrive within ``REQUEST_DEADLINE_S`` in total, however slowly its
bytes trickle in; at most ``max_connections`` connections have a thread, the one that has
waited longest for its request giving way to a newcomer (503 only when all are answering);
the listen backlog absorbs bursts of scrapers and engines connecting together.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import socket
import socketserver
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry

from kvcast.exporters import http_pages as pages
from kvcast.exporters.http_pages import PublishedState

__all__ = ["HttpServer", "PublishedState"]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0  # socket timeout of one read or write
REQUEST_DEADLINE_S = 10.0  # a whole request's line and headers, from the first byte awaited
MAX_CONNECTIONS = 128  # connections with a thread at once
BACKLOG = 1024  # listen backlog (the kernel caps it at net.core.somaxconn)
_POLL_S = 0.1  # how often the accept loop checks for shutdown
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: 17\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    b'{"error": "busy"}'
)
_ALLOW = "GET, HEAD"


class _Server(ThreadingHTTPServer):
    """Threads per connection, at most ``max_connections`` of them.

    Ordering rule when all are taken: the connection that has waited longest for its request
    (its line or headers, or the next request of a kept-alive connection) is closed to make
    room, so a flood of idle or trickling connections cannot lock scrapers and engines out;
    only when every connection is busy answering is the newcomer answered 503.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = BACKLOG  # the stdlib default of 5 drops bursts of clients

    def __init__(
        self,
        host: str,
        port: int,
        state: PublishedState,
        registry: CollectorRegistry,
        max_connections: int = MAX_CONNECTIONS,
        request_deadline_s: float = REQUEST_DEADLINE_S,
    ):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.state = state
        self.registry = registry
        self.max_connections = max_connections
        self.request_deadline_s = request_deadline_s
        self._lock = threading.Lock()
        self._open = 0  # connections with a thread
        self._waiting: dict[socket.socket, float] = {}  # awaiting a request: since (monotonic)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if self._open >= self.max_connections and not self._evict_longest_waiting():
                busy = True
            else:
                busy = False
                self._open += 1
        if busy:
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass  # a client that cannot take the reply now gets the close alone
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed(request)
            raise

    def _evict_longest_waiting(self) -> bool:
        if not self._waiting:
            return False
        victim = min(self._waiting, key=self._waiting.__getitem__)
        del self._waiting[victim]
        with contextlib.suppress(OSError):
            victim.shutdown(socket.SHUT_RDWR)  # its thread reads the end and returns
        return True

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed(request)

    def _closed(self, request: Any) -> None:
        with self._lock:
            self._open -= 1
            self._waiting.pop(request, None)

    def awaiting_request(self, connection: socket.socket, waiting: bool) -> None:
        """The handler's state: reading a request (evictable) or answering one."""
        with self._lock:
            if waiting:
                self._waiting[connection] = time.monotonic()
            else:
                self._waiting.pop(connection, None)

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse DNS lookup (``getfqdn`` can stall for seconds)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("HTTP connection from %s failed", client_address, exc_info=True)


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each bounded by what is left of the request's deadline."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self.deadline = math.inf  # set for each request by the handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self._connection.settimeout(min(left, REQUEST_TIMEOUT_S))
        return self._connection.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    server_version = "kvcast"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.server.request_deadline_s
        self.server.awaiting_request(self.connection, True)
        super().handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self.server.awaiting_request(self.connection, False)
        return parsed

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def _not_allowed(self) -> None:
        self._discard_body()
        path = self._path()
        if path in pages.ROUTES:
            doc = {"error": "method not allowed", "allow": _ALLOW.split(", ")}
            reply = pages.json_response(HTTPStatus.METHOD_NOT_ALLOWED, doc, headers=_ALLOW_HDR)
        else:
            reply = pages.not_found(path)
        self._send(reply, head=False)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _path(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _dispatch(self, head: bool) -> None:
        path = self._path()
        page = pages.ROUTES.get(path)
        if page is None:
            self._send(pages.not_found(path), head)
            return
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        request = pages.Request(self.server.state, self.server.registry, self.headers)
        try:
            reply = page(request._replace(pretty="pretty" in query, query=query))
        except Exception:
            log.exception("HTTP page %s failed", path)
            reply = pages.json_response(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal"})
        self._send(reply, head)

    def _send(self, reply: pages.Response, head: bool) -> None:
        has_body = reply.status != HTTPStatus.NOT_MODIFIED
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        if has_body:
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if has_body and not head:
            self.wfile.write(reply.body)

    def _discard_body(self, limit: int = 65536) -> None:
        """Read and drop a small request body, so closing the socket does not reset the reply."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return
        if 0 < length <= limit:
            self.rfile.read(length)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed requests (400, 414, 501 ...) get JSON naming only the status."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # its version did not parse: answer with headers
            self.request_version = "HTTP/1.0"
        status = HTTPStatus(code)
        headers = _ALLOW_HDR if code == HTTPStatus.NOT_IMPLEMENTED else ()
        doc = {"error": status.phrase.lower()}
        self._send(pages.json_response(status, doc, headers=headers), self.command == "HEAD")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("HTTP %s " + format, self.address_string(), *args)


_ALLOW_HDR: pages.Headers = (("Allow", _ALLOW),)


class HttpServer:
    """Serves a ``PublishedState`` and a Prometheus registry on ``host:port``.

    >>> server = HttpServer("127.0.0.1", 0, state, CollectorRegistry())  # doctest: +SKIP
    >>> server.start(); server.url  # doctest: +SKIP
    'http://127.0.0.1:40123'
    """

    def __init__(
        self,
        host: str,
        port: int,
        state: PublishedState,
        registry: CollectorRegistry,
        max_connections: int = MAX_CONNECTIONS,
        request_deadline_s: float = REQUEST_DEADLINE_S,
    ) -> None:
        """``max_connections``: connections served at once; ``request_deadline_s``: seconds a
        request's line and headers may take in all (see the module doc)."""
        self._host, self._port = host, port
        self._state, self._registry = state, registry
        self._limits = (max_connections, request_deadline_s)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Bind (port 0 picks a free port) and serve in a daemon thread; OSError if taken."""
        with self._lock:
            if self._closed or self._server is not None:
                raise RuntimeError("an HttpServer starts once")
            self._server = _Server(
                self._host, self._port, self._state, self._registry, *self._limits
            )
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": _POLL_S},
                name=f"kvcast-http-{self.port}",
                daemon=True,
            )
            self._thread.start()
        log.info("HTTP server listening on %s", self.url)

    @property
    def port(self) -> int:
        """The bound port once started, the requested one before."""
        return self._server.server_port if self._server is not None else self._port

    @property
    def url(self) -> str:
        """Base URL for clients (``http://127.0.0.1:9400``); a wildcard host maps to loopback."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self._host, self._host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop accepting and release the port (within ~``_POLL_S`` seconds); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=1.0)
