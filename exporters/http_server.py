"""The daemon's HTTP server: stdlib ``http.server``, one daemon thread per connection.

Endpoints (GET and HEAD): ``/`` (the status page), ``/healthz``, ``/readyz``, ``/v1/forecast``,
``/v1/table`` and ``/metrics``; the pages themselves live in :mod:`kvcast.exporters.http_pages`.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry

from kvcast.exporters import http_pages as pages
from kvcast.exporters.http_pages import PublishedState

__all__ = ["HttpServer", "PublishedState"]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0  # socket timeout of one connection
_POLL_S = 0.1  # how often the accept loop checks for shutdown
_ALLOW = "GET, HEAD"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # listen backlog; the stdlib default of 5 drops bursts of clients

    def __init__(self, host: str, port: int, state: PublishedState, registry: CollectorRegistry):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.state = state
        self.registry = registry
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse DNS lookup (``getfqdn`` can stall for seconds)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("HTTP connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    server_version = "kvcast"
    sys_version = ""

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
            reply = page(request._replace(pretty="pretty" in query))
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
        self, host: str, port: int, state: PublishedState, registry: CollectorRegistry
    ) -> None:
        self._host, self._port = host, port
        self._state, self._registry = state, registry
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Bind (port 0 picks a free port) and serve in a daemon thread; OSError if taken."""
        with self._lock:
            if self._closed or self._server is not None:
                raise RuntimeError("an HttpServer starts once")
            self._server = _Server(self._host, self._port, self._state, self._registry)
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
