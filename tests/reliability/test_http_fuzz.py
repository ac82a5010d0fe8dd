"""The daemon's HTTP server under hostile clients (raw sockets), then still answering /healthz.

Against a running daemon (the embedded default): seeded random request lines, methods,
paths, versions and headers; long URLs and headers; path traversal and directory probes;
slowloris clients that send a partial request and stall. Every response must be well-formed
HTTP with a known status, no body may echo the request or reveal files, a stalled connection
must be closed by the server within its timeout, and /healthz must answer meanwhile and after.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from kvcast.exporters.http_server import REQUEST_TIMEOUT_S
from kvcast.lab.bench.processes import DaemonProcess
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.slow

DOCUMENTED = ("/", "/healthz", "/readyz", "/metrics", "/v1/forecast", "/v1/table")
KNOWN_STATUS = {200, 304, 400, 404, 405, 408, 413, 414, 431, 501, 503, 505}
MARKER = "zq-fuzz-marker"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> DaemonProcess:
    log = tmp_path_factory.mktemp("http") / "daemon.log"
    process = DaemonProcess(
        ["--metrics-addr", "127.0.0.1:0", "--sample-conversations", "1500", "--speedup", "2000",
         "--refresh-interval", "0.3", "--status-interval", "60"], log,
    )  # fmt: skip
    yield process
    assert process.stop(signal.SIGTERM) == 0
    assert "Traceback" not in process.text()


def exchange(url: str, data: bytes, timeout: float = 10) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        # The server may answer an oversized request (431, 414) and close before the client has
        # sent it all; the reply it sent is still read and checked below.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
        return response.status == 200


def random_request(rng: random.Random) -> bytes:
    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH",
               "get", "G\x00T", "", "X" * 300, "GET GET"]  # fmt: skip
    paths = [*DOCUMENTED, "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd",
             "/v1/../../../../etc/shadow", "/v1/", "/v1", "/static/", "/exporters/",
             "/status_page.html", "/.git/config", "/metrics?" + "a=b&" * 50, "/%00", "/%",
             "*", "http://evil.example/v1/table", f"/{MARKER}", "/v1/table;/../",
             "/" + "a" * rng.randint(1000, 70_000), ""]  # fmt: skip
    versions = ["HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/2.0", "HTTP/9.9", "HTTP/1.1x", "", "🙂"]
    line = f"{rng.choice(methods)} {rng.choice(paths)} {rng.choice(versions)}"
    headers = []
    for _ in range(rng.choice([0, 1, 3, 20, 120])):
        name = rng.choice(["Host", "Accept", "If-None-Match", "Content-Length", f"X-{MARKER}",
                           "Transfer-Encoding", "Expect", "Connection", "Bad H", ""])  # fmt: skip
        value = rng.choice(["", "*", "-1", "99999999999", "chunked", "100-continue",
                            "close", "W/\"1\", \"2\"", "x" * rng.choice([10, 70_000]),
                            MARKER, "\x00\x01"])  # fmt: skip
        headers.append(f"{name}: {value}")
    text = "\r\n".join([line, *headers]) + "\r\n\r\n"
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:  # raw garbage, or a request cut anywhere
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
    elif rng.random() < 0.15:
        data = data[: rng.randrange(len(data) + 1)]
    return data


def check_response(reply: bytes) -> None:
    if not reply:
        return  # the server may close on garbage without a reply (e.g. an empty request)
    status_line = reply.split(b"\r\n", 1)[0]
    if status_line.startswith(b"HTTP/1."):
        assert int(status_line.split()[1]) in KNOWN_STATUS, status_line
    else:  # an HTTP/0.9 request ("GET /path") gets the bare body, as HTTP/0.9 has no headers
        assert reply.startswith((b"{", b"<!", b"# HELP")), reply[:100]
    assert MARKER.encode() not in reply
    assert b"root:" not in reply and b"[core]" not in reply  # /etc/passwd, .git/config
    assert b"Traceback" not in reply and b"<title>Directory listing" not in reply


def test_random_requests_get_well_formed_answers(daemon: DaemonProcess) -> None:
    rng = random.Random(4242)
    for count in range(400):
        check_response(exchange(daemon.url, random_request(rng)))
        if count % 50 == 0:
            assert healthy(daemon.url)
    TALLY.add(hostile_inputs=400)
    assert healthy(daemon.url)


def test_only_documented_paths_are_served(daemon: DaemonProcess) -> None:
    for path in DOCUMENTED:
        reply = exchange(daemon.url, f"GET {path} HTTP/1.0\r\n\r\n".encode())
        assert reply.split()[1] in (b"200", b"503"), (path, reply[:200])
    probes = ["/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/static/", "/exporters/",
              "/status_page.html", "/.git/config", "/v1", "/v1/", "/v2/table", "/metrics/x",
              "/healthz/../../etc/passwd", "/etc/passwd"]  # fmt: skip
    for path in probes:
        reply = exchange(daemon.url, f"GET {path} HTTP/1.0\r\n\r\n".encode())
        assert reply.split()[1] == b"404", (path, reply[:200])
        check_response(reply)
    reply = exchange(daemon.url, b"POST /v1/table HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc")
    assert reply.split()[1] == b"405"
    assert b"\r\nServer: kvcast" in reply and b"Python" not in reply  # no version leak
    TALLY.add(hostile_inputs=len(probes) + 1)


def test_slowloris_clients_are_cut_off_and_healthz_keeps_answering(daemon: DaemonProcess) -> None:
    host, port = daemon.url.removeprefix("http://").split(":")
    stalled = []
    for n in range(60):
        sock = socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S + 10)
        sock.sendall(b"GET /v1/table HTTP/1.1\r\nHost: x\r\nX-Slow-" + str(n).encode())
        stalled.append(sock)
    started = time.monotonic()
    assert healthy(daemon.url)  # answered while 60 connections stall
    assert time.monotonic() - started < 2
    for sock in stalled[:5]:  # keep trickling on a few: still cut off at the socket timeout
        sock.sendall(b"a")
    closed = 0
    for sock in stalled:
        try:
            data = sock.recv(65536)  # the server times the connection out and closes it
            closed += 1 if data == b"" or data.startswith(b"HTTP/1.") else 0
        except (ConnectionResetError, TimeoutError):
            closed += 1
        finally:
            sock.close()
    elapsed = time.monotonic() - started
    assert closed == len(stalled)
    assert elapsed < REQUEST_TIMEOUT_S + 8, elapsed
    assert healthy(daemon.url)
    TALLY.add(hostile_inputs=len(stalled))


def test_a_flood_of_connections_leaves_the_server_answering(daemon: DaemonProcess) -> None:
    rng = random.Random(7)
    socks = []
    for _ in range(300):
        try:
            socks.append(socket.create_connection(tuple(_address(daemon)), timeout=2))
        except OSError:
            break
        if rng.random() < 0.5:
            socks[-1].sendall(b"GET /metrics HTTP/1.1\r\n")
    assert healthy(daemon.url)
    for sock in socks:
        sock.close()
    time.sleep(0.5)
    assert healthy(daemon.url)
    TALLY.add(hostile_inputs=len(socks))


def _address(daemon: DaemonProcess) -> tuple[str, int]:
    host, port = daemon.url.removeprefix("http://").split(":")
    return host, int(port)


def test_status_page_and_documents_are_static(daemon: DaemonProcess, tmp_path: Path) -> None:
    # Query strings and headers cannot smuggle anything into a page.
    reply = exchange(daemon.url, f"GET /?x=<script>{MARKER}</script> HTTP/1.0\r\n"
                                 f"Referer: {MARKER}\r\n\r\n".encode())  # fmt: skip
    assert reply.split()[1] == b"200"
    check_response(reply)
