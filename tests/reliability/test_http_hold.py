"""Clients that hold connections cannot take the HTTP server from scrapers and engines.

Real sockets on 127.0.0.1 against the real server (``HttpServer`` over the daemon's
``Published`` state): clients that trickle one header byte at a time (each byte inside the
socket timeout, so only a total deadline can end them), more idle connections than the
server's connection cap, and a burst of honest clients all connecting at once. Every loop is
bounded in count and time.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry

from kvcast.daemon.published import Published
from kvcast.exporters.http_server import HttpServer
from tests.reliability.tally import TALLY

DEADLINE_S = 2.0
CAP = 16


@pytest.fixture
def server() -> Iterator[HttpServer]:
    served = HttpServer(
        "127.0.0.1",
        0,
        Published(lambda: (True, "ok")),
        CollectorRegistry(),
        max_connections=CAP,
        request_deadline_s=DEADLINE_S,
    )
    served.start()
    yield served
    served.close()


def healthz(server: HttpServer) -> int:
    with urllib.request.urlopen(server.url + "/healthz", timeout=5) as reply:
        return reply.status


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset), without blocking."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def test_a_request_trickling_in_is_cut_at_its_total_deadline(server: HttpServer) -> None:
    """One header byte every 0.5 s (each well inside the 5 s socket timeout): the connection
    is closed once the request has taken ``request_deadline_s`` in all."""
    clients = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40
    started = time.monotonic()
    open_after: list[float] = []
    try:
        for byte in request:
            alive = [c for c in clients if not closed_by_server(c)]
            if not alive:
                break
            assert time.monotonic() - started < DEADLINE_S + 3, "trickling clients still open"
            for client in alive:
                with contextlib.suppress(OSError):  # closed between the check and the send
                    client.send(bytes([byte]))
            open_after.append(time.monotonic() - started)
            time.sleep(0.5)
        assert all(closed_by_server(c) for c in clients)
        assert open_after[-1] < DEADLINE_S + 3
    finally:
        for client in clients:
            client.close()
    assert healthz(server) == 200
    TALLY.add(hostile_inputs=len(clients))


def test_more_idle_clients_than_the_cap_cannot_lock_out_a_scrape(server: HttpServer) -> None:
    """Six times the cap of connections that send nothing (or half a request line): a scrape
    still gets through, the connection that waited longest giving way; threads stay bounded."""
    threads_before = threading.active_count()
    holders = []
    try:
        for n in range(6 * CAP):
            holder = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            if n % 2:
                holder.sendall(b"GET /metr")
            holders.append(holder)
        answered = [healthz(server) for _ in range(10)]
        assert answered == [200] * 10
        assert threading.active_count() <= threads_before + CAP + 2
    finally:
        for holder in holders:
            holder.close()
    TALLY.add(hostile_inputs=len(holders))


def test_a_burst_of_honest_clients_gets_answers_not_resets(server: HttpServer) -> None:
    """300 clients connecting at once (far more than the cap): each gets an HTTP answer, 200
    or a 503 with Retry-After while every connection is busy; none is reset or left hanging."""

    def one(_: int) -> int:
        try:
            with urllib.request.urlopen(server.url + "/healthz", timeout=10) as reply:
                return reply.status
        except urllib.error.HTTPError as error:
            assert error.headers.get("Retry-After") == "1"
            return error.code

    with ThreadPoolExecutor(max_workers=64) as pool:
        statuses = list(pool.map(one, range(300)))
    assert set(statuses) <= {200, 503}
    assert statuses.count(200) >= CAP
    assert healthz(server) == 200
