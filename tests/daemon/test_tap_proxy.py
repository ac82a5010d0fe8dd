"""``kvcast tap`` as a reverse proxy under real load and against misbehaving peers (issue 32).

The peers: ``RawUpstream``, an engine at the socket level (it stands in for vLLM's
OpenAI-compatible server where a test needs exact bytes: repeated headers, a malformed or
newline-free stream, a compressed body, a silent or vanishing engine), the aiohttp stand-in
``kvcast.lab.bench.openai_standin`` where a test needs many well-formed streams, and real
clients: ``http.client``, raw sockets (to hang up mid-stream) and aiohttp's client. The recorder
is a list (what the tap hands over is the point here); ``test_tap.py`` runs the real ``openai``
client and Kafka producer end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import logging
import socket
import threading
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kvcast.daemon.tap import Tap, TapLimits
from kvcast.daemon.tap_copy import StreamCopy
from kvcast.lab.bench.openai_standin import GAUGE, standin_app
from kvcast.lab.bench.processes import free_port, wait_until

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


class Loop:
    """An event loop on its own thread, for the servers (and the aiohttp client)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 20.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class Recorded:
    """A recorder that keeps what the tap hands it: (request, response, context)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict, dict | None, dict]] = []

    def record(self, request: Any, response: Any = None, **context: Any) -> None:
        self.calls.append((request, response, context))


Script = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawUpstream:
    """An engine at the socket level: reads one request (head and body) per connection, keeps
    its bytes, then runs ``script(request, reader, writer)``, which writes what it wants.
    ``closed_by_peer`` counts connections the tap closed while the script waited on them."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.closed_by_peer = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            request = head + await reader.readexactly(length)
            self.requests.append(request)
            await self.script(request, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def wait_closed_by_peer(self, reader: asyncio.StreamReader) -> None:
        """Wait (bounded) until the other end closes this connection; count it."""
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(10):
                while await reader.read(65536):
                    pass
                self.closed_by_peer += 1

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


def request_headers(raw: bytes) -> list[tuple[str, str]]:
    """The (name, value) header lines of a raw request, in order, names lowercased."""
    lines = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return [(n.strip().lower(), v.strip()) for n, _, v in (line.partition(":") for line in lines)]


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)


SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip


def sse(data: dict | str) -> bytes:
    return b"data: " + (data if isinstance(data, str) else json.dumps(data)).encode() + b"\n\n"


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


class Proxy:
    """A tap on a free port in front of ``upstream_port``, recording into ``recorded``."""

    def __init__(self, loop: Loop, upstream_port: int, recorder: Recorded | None = None,
                 **limits: Any) -> None:  # fmt: skip
        self.loop = loop
        self.recorded = recorder or Recorded()
        self.tap = Tap(f"http://127.0.0.1:{upstream_port}", self.recorded,
                       limits=TapLimits(**limits))  # fmt: skip
        self.port = free_port()
        self.runner = loop.run(self.tap.start("127.0.0.1", self.port))

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)

    def close(self) -> None:
        self.loop.run(self.runner.cleanup())


@contextlib.contextmanager
def proxied(loop: Loop, script: Script, recorder: Recorded | None = None,
            **limits: Any) -> Iterator[tuple[RawUpstream, Proxy]]:  # fmt: skip
    upstream = loop.run(RawUpstream(script).start())
    proxy = Proxy(loop, upstream.port, recorder, **limits)
    try:
        yield upstream, proxy
    finally:
        proxy.close()
        loop.run(upstream.stop())


def post(
    proxy: Proxy, body: bytes, path: str = CHAT, headers: dict[str, str] | None = None
) -> tuple[http.client.HTTPResponse, bytes]:
    connection = proxy.connection()
    connection.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    return response, response.read()


STREAM_REQUEST = json.dumps({"model": "m", "stream": True, "stream_options": {
    "include_usage": True}, "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip


# -- 1. no connection cap below the operator's ---------------------------------------------------


def test_160_slow_streams_are_all_open_upstream_at_once(loop: Loop) -> None:
    """The stand-in holds every stream after its first word until 160 are open at once: with
    aiohttp's default pool (100) the tap would let through 100 and the rest would wait."""
    streams = 160
    upstream_app = standin_app(hold_until_open=streams)
    upstream_port = free_port()

    async def serve() -> web.AppRunner:
        runner = web.AppRunner(upstream_app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", upstream_port, backlog=1024).start()
        return runner

    upstream_runner = loop.run(serve())
    proxy = Proxy(loop, upstream_port)

    async def clients() -> list[bytes]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(i: int) -> bytes:
                body = {"model": "m", "stream": True, "messages": [{"role": "user",
                        "content": f"q{i}"}]}  # fmt: skip
                url = f"http://127.0.0.1:{proxy.port}{CHAT}"
                async with session.post(url, json=body) as response:
                    return await response.read()

            return await asyncio.gather(*(one(i) for i in range(streams)))

    try:
        bodies = loop.run(clients(), timeout=30)
    finally:
        proxy.close()
        loop.run(upstream_runner.cleanup())
    assert upstream_app[GAUGE].most == streams  # all at the engine together
    assert upstream_app[GAUGE].held_too_long is False  # nobody waited for a slot
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    wait_until(lambda: len(proxy.recorded.calls) == streams, 10, "every stream's event")


# -- 2. a client that hangs up releases its upstream request at once -----------------------------


@pytest.mark.parametrize("engine_speaks_first", [True, False], ids=["mid-stream", "silent"])
def test_a_client_hang_up_closes_its_upstream_request(
    loop: Loop, caplog: pytest.LogCaptureFixture, engine_speaks_first: bool
) -> None:
    """The engine sends one word (or nothing at all) and then waits; the client hangs up. The
    engine must see its connection close (before: it waited forever, holding a pool slot);
    a stream that had started is recorded with what was served and ``cut``; no ERROR log."""
    caplog.set_level(logging.DEBUG)

    async def engine(_request: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        if engine_speaks_first:
            writer.write(SSE_HEAD + chunked(sse({"id": "r1", "choices": [
                {"index": 0, "delta": {"content": "first "}}]})))  # fmt: skip
            await writer.drain()
        await upstream.wait_closed_by_peer(reader)

    with proxied(loop, engine) as (upstream, proxy):
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        client.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (CHAT.encode(), len(STREAM_REQUEST),
                                                          STREAM_REQUEST))  # fmt: skip
        if engine_speaks_first:
            received = b""
            while b"first" not in received:
                received += client.recv(65536)
        else:
            wait_until(lambda: upstream.requests, 10, "the request at the engine")
        client.close()
        wait_until(lambda: upstream.closed_by_peer == 1, 10, "the engine to see its request go")
        if engine_speaks_first:
            wait_until(lambda: proxy.recorded.calls, 10, "the cut stream's event")
            _request, response, context = proxy.recorded.calls[0]
            assert context["cut"] == "client_disconnect"
            assert response["id"] == "r1"
            assert response["choices"][0]["message"]["content"] == "first "
        else:
            assert proxy.recorded.calls == []  # nothing was served
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- 3. streams relayed byte for byte, whatever the parser thinks ---------------------------------


def test_a_malformed_stream_reaches_the_client_byte_for_byte(loop: Loop) -> None:
    """Lines the tap's parser cannot use (choices not a list, JSON nested 100,000 deep, bytes
    that are not UTF-8, a line that is not SSE) are relayed exactly; the event keeps the rest."""
    parts = [
        sse({"id": "r2", "choices": [{"index": 0, "delta": {"content": "one "}}]}),
        sse('{"choices": 5}'),
        b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n",
        b'data: {"choices": [{"delta": {"content": "\xff\xfe"}}]}\n\n',
        b": a comment\nnot-sse at all \x00\x01\n\n",
        sse({"choices": [{"index": 0, "delta": {"content": "two"}}]}),
        sse({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2}}),
        b"data: [DONE]\n\n",
    ]

    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD)
        for part in parts:  # split mid-line too
            writer.write(chunked(part[: len(part) // 2], part[len(part) // 2 :]))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    with proxied(loop, engine) as (_upstream, proxy):
        response, body = post(proxy, STREAM_REQUEST)
        assert response.status == 200
        assert body == b"".join(parts)
        wait_until(lambda: proxy.recorded.calls, 10, "the event")
    _request, recorded, context = proxy.recorded.calls[0]
    assert "cut" not in context
    assert recorded["choices"][0]["message"]["content"] == "one two"
    assert recorded["usage"]["prompt_tokens"] == 12


def test_a_splice_of_include_usage_leaves_the_clients_other_bytes_alone(loop: Loop) -> None:
    sent = b'{"model": "m",   "stream": true, "messages": [{"role": "user", "content": "x"}] }\n'

    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    with proxied(loop, engine) as (upstream, proxy):
        post(proxy, sent)
    received = upstream.requests[0].split(b"\r\n\r\n", 1)[1]
    assert received == sent[:-2] + b',"stream_options":{"include_usage":true}}\n'
    assert json.loads(received)["stream_options"] == {"include_usage": True}


# -- 4. headers as a multi-map; hop-by-hop; compressed bodies untouched ---------------------------


def test_headers_are_relayed_as_a_multimap_and_compressed_bodies_untouched(loop: Loop) -> None:
    """Two Cookie and two X-Forwarded-For reach the engine as sent, two Set-Cookie reach the
    client; hop-by-hop headers (and those named in Connection) stop at the tap; no
    Accept-Encoding is added; the deflate body arrives as the engine sent it, and the event
    has its token counts from a decoded copy."""
    reply = json.dumps(
        {
            "id": "r3",
            "usage": {"prompt_tokens": 7, "completion_tokens": 1},
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
        }
    )
    compressed = zlib.compress(reply.encode())

    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Encoding: deflate\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
                     b"Connection: keep-alive, X-Engine-Hop\r\nX-Engine-Hop: secret\r\n"
                     b"Keep-Alive: timeout=5\r\nX-Kept: yes\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(compressed), compressed))  # fmt: skip
        await writer.drain()

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "q"}]}).encode()
    with proxied(loop, engine) as (upstream, proxy):
        connection = proxy.connection()
        connection.putrequest("POST", CHAT, skip_accept_encoding=True)
        for name, value in [("Content-Type", "application/json"), ("Cookie", "c=1"),
                            ("Cookie", "d=2"), ("X-Forwarded-For", "10.0.0.1"),
                            ("X-Forwarded-For", "10.0.0.2"), ("Connection", "X-Client-Hop"),
                            ("X-Client-Hop", "secret"), ("Keep-Alive", "300"), ("TE", "trailers"),
                            ("Content-Length", str(len(body)))]:  # fmt: skip
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        received = response.read()
        wait_until(lambda: proxy.recorded.calls, 10, "the event")
    sent = request_headers(upstream.requests[0])
    assert [v for n, v in sent if n == "cookie"] == ["c=1", "d=2"]
    assert [v for n, v in sent if n == "x-forwarded-for"] == ["10.0.0.1", "10.0.0.2"]
    names = {n for n, _ in sent}
    assert not names & {"x-client-hop", "keep-alive", "te", "accept-encoding", "user-agent"}
    assert response.msg.get_all("Set-Cookie") == ["a=1", "b=2"]
    assert response.getheader("X-Engine-Hop") is None and response.getheader("Keep-Alive") is None
    assert response.getheader("X-Kept") == "yes"
    assert response.getheader("Content-Encoding") == "deflate"
    assert received == compressed
    assert proxy.recorded.calls[0][1]["usage"]["prompt_tokens"] == 7


def test_an_encoding_the_tap_cannot_decode_still_records_the_event(loop: Loop) -> None:
    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: zstd\r\nContent-Length: 4\r\n\r\n\x28\xb5\x2f\xfd"
        )
        await writer.drain()

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "q"}]}).encode()
    with proxied(loop, engine) as (_upstream, proxy):
        _response, received = post(proxy, body)
        wait_until(lambda: proxy.recorded.calls, 10, "the event")
    assert received == b"\x28\xb5\x2f\xfd"
    assert proxy.recorded.calls[0][1] == {}  # recorded, without token counts


# -- 5. timeouts and upstream failures ------------------------------------------------------------


def test_an_unreachable_upstream_gives_502(loop: Loop) -> None:
    proxy = Proxy(loop, free_port())  # nothing listens there
    try:
        response, body = post(proxy, STREAM_REQUEST)
    finally:
        proxy.close()
    assert response.status == 502
    assert json.loads(body)["error"]["code"] == 502


def test_an_upstream_that_never_answers_gives_504_and_is_let_go(loop: Loop) -> None:
    async def engine(_request: bytes, reader: asyncio.StreamReader,
                     _writer: asyncio.StreamWriter) -> None:  # fmt: skip
        await upstream.wait_closed_by_peer(reader)

    with proxied(loop, engine, first_byte_timeout_s=0.3) as (upstream, proxy):
        response, _body = post(proxy, STREAM_REQUEST)
        assert response.status == 504
        wait_until(lambda: upstream.closed_by_peer == 1, 10, "the tap to drop the request")
    assert proxy.recorded.calls == []


@pytest.mark.parametrize("failure", ["timeout", "upstream_error"])
def test_a_stream_cut_upstream_is_cut_for_the_client_and_recorded(loop: Loop, failure: str) -> None:
    """After one word the engine goes silent (past --idle-timeout) or drops the connection:
    the client's response ends without its last chunk (it can tell), the event says why."""

    async def engine(_request: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD + chunked(sse({"id": "r4", "choices": [
            {"index": 0, "delta": {"content": "only "}}]})))  # fmt: skip
        await writer.drain()
        if failure == "timeout":
            await upstream.wait_closed_by_peer(reader)
        else:
            writer.transport.abort()

    with proxied(loop, engine, idle_timeout_s=0.3) as (upstream, proxy):
        connection = proxy.connection()
        connection.request("POST", CHAT, STREAM_REQUEST)
        response = connection.getresponse()
        assert response.status == 200
        with pytest.raises(http.client.IncompleteRead) as cut:
            response.read()
        assert b"only" in cut.value.partial
        wait_until(lambda: proxy.recorded.calls, 10, "the cut stream's event")
    _request, recorded, context = proxy.recorded.calls[0]
    assert context["cut"] == failure
    assert recorded["choices"][0]["message"]["content"] == "only "


def test_no_total_limit_a_stream_longer_than_every_timeout_completes(loop: Loop) -> None:
    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD)
        for word in range(8):  # 8 x 0.15 s = 1.2 s in all, each gap well under 0.5 s
            writer.write(chunked(sse({"choices": [{"delta": {"content": f"{word} "}}]})))
            await writer.drain()
            await asyncio.sleep(0.15)
        writer.write(chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    limits = {"first_byte_timeout_s": 0.5, "idle_timeout_s": 0.5, "connect_timeout_s": 0.5}
    with proxied(loop, engine, **limits) as (_upstream, proxy):
        _response, body = post(proxy, STREAM_REQUEST)
        wait_until(lambda: proxy.recorded.calls, 10, "the event")
    assert body.endswith(b"data: [DONE]\n\n")
    assert proxy.recorded.calls[0][1]["choices"][0]["message"]["content"] == "0 1 2 3 4 5 6 7 "
    assert "cut" not in proxy.recorded.calls[0][2]


# -- 6. bounded memory per line and per event ----------------------------------------------------


def test_a_64_mib_stream_without_newlines_relays_while_others_are_served(loop: Loop) -> None:
    """The engine sends 32 MiB of one endless line, then waits until another client's request
    through the same tap has been answered, then 32 MiB more: the client gets every byte, the
    other request was served in between, and the process never held more than a few MiB at
    once (the old tap kept the whole line, 64 MiB, and re-split it on every chunk)."""
    piece = b"x" * (64 << 10)
    half = 512  # pieces: 32 MiB
    other_served = asyncio.Event()

    async def engine(request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        if b"GET /v1/models" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            return
        writer.write(SSE_HEAD + chunked(b"data: "))
        for sent in range(2 * half):
            if sent == half:
                async with asyncio.timeout(10):
                    await other_served.wait()
            writer.write(chunked(piece))
            await writer.drain()
        writer.write(chunked(b"\n\ndata: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    digest = hashlib.sha256()
    order: list[str] = []
    with proxied(loop, engine) as (upstream, proxy):

        def stream() -> None:
            connection = proxy.connection()
            connection.request("POST", CHAT, STREAM_REQUEST)
            response = connection.getresponse()
            while data := response.read(1 << 20):
                digest.update(data)
            order.append("stream done")

        tracemalloc.start()
        reader = threading.Thread(target=stream)
        reader.start()
        wait_until(lambda: upstream.requests, 10, "the stream to start")
        connection = proxy.connection()
        connection.request("GET", "/v1/models")
        assert connection.getresponse().read() == b"{}"
        order.append("other served")
        loop.call(other_served.set)
        reader.join(timeout=60)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        wait_until(lambda: proxy.recorded.calls, 10, "the event")
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held at once"
    expected = hashlib.sha256(b"data: " + piece * (2 * half) + b"\n\ndata: [DONE]\n\n")
    assert digest.hexdigest() == expected.hexdigest()
    assert order == ["other served", "stream done"]
    assert proxy.recorded.calls[0][1]["choices"][0]["message"]["content"] == ""


def test_the_stream_copy_holds_one_bounded_line() -> None:
    copy = StreamCopy(max_bytes=16 << 20, encoding=None, max_line_bytes=1 << 20)
    copy.feed(b"data: ")
    for _ in range(1024):  # 64 MiB, no newline
        copy.feed(b"y" * (64 << 10))
        assert copy.pending_bytes <= 1 << 20
    copy.feed(b"\n" + sse({"choices": [{"delta": {"content": "after"}}]}))
    assert copy.gave_up is None and copy.skipped_lines == 1
    assert copy.body()["choices"][0]["message"]["content"] == "after"


def test_a_reply_over_max_event_bytes_drops_the_event_not_the_stream(loop: Loop) -> None:
    parts = [sse({"choices": [{"delta": {"content": "z" * 1000}}]}) for _ in range(20)]

    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD + chunked(*parts) + b"0\r\n\r\n")
        await writer.drain()

    with proxied(loop, engine, max_event_bytes=10_000) as (_upstream, proxy):
        _response, body = post(proxy, STREAM_REQUEST)
        wait_until(lambda: proxy.tap.counts["events_dropped_gave_up"] == 1, 10, "the drop")
    assert body == b"".join(parts)
    assert proxy.recorded.calls == []


# -- 7. nested request JSON passes through ---------------------------------------------------------


def test_deeply_nested_request_json_is_passed_through_untracked(loop: Loop) -> None:
    nested = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 10\r\n\r\n{\"ok\": 1 }")  # fmt: skip
        await writer.drain()

    with proxied(loop, engine) as (upstream, proxy):
        response, body = post(proxy, nested)
    assert (response.status, body) == (200, b'{"ok": 1 }')
    assert upstream.requests[0].endswith(b"\r\n\r\n" + nested)
    assert proxy.recorded.calls == [] and proxy.tap.counts["untracked"] == 1


# -- 8. the access log never has a query string ----------------------------------------------


def test_the_access_log_never_writes_query_strings(
    loop: Loop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def engine(request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()

    with proxied(loop, engine) as (upstream, proxy):
        connection = proxy.connection()
        connection.request("GET", "/v1/models?api_key=SECRET&x=1")
        assert connection.getresponse().read() == b"{}"
        wait_until(lambda: any(r.name == "kvcast.tap.access" for r in caplog.records), 10,
                   "the access log line")  # fmt: skip
    assert b"GET /v1/models?api_key=SECRET&x=1 " in upstream.requests[0]  # passed on as sent
    lines = [r.getMessage() for r in caplog.records if r.name == "kvcast.tap.access"]
    assert any("GET /v1/models 200" in line for line in lines)
    assert "SECRET" not in caplog.text


# -- 9. identity for sessions ----------------------------------------------------------------------


def test_the_identity_header_and_the_bearer_token_reach_the_recorder(loop: Loop) -> None:
    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    with proxied(loop, engine, identity_headers=("x-session-id", "x-user-id")) as (_u, proxy):
        post(proxy, STREAM_REQUEST, headers={"X-User-Id": "alice", "Authorization": "Bearer sk-1"})
        post(proxy, STREAM_REQUEST)
        wait_until(lambda: len(proxy.recorded.calls) == 2, 10, "both events")
    first, second = (context for _, _, context in proxy.recorded.calls)
    assert (first["identity"], first["api_key"]) == ("alice", "sk-1")
    assert "identity" not in second and "api_key" not in second
    assert isinstance(first["arrival_s"], float)


def test_keywords_an_older_builder_lacks_are_left_out(loop: Loop) -> None:
    """Before the builder takes identity/api_key/cut, the tap passes only what it takes."""

    class OldBuilder:
        def build(self, request: Any, response: Any = None, *, arrival_s: float | None = None,
                  session_id: str | None = None) -> dict:  # fmt: skip
            return {}

    class OldRecorder(Recorded):
        builder = OldBuilder()

    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    recorder = OldRecorder()
    with proxied(loop, engine, recorder) as (_upstream, proxy):
        post(proxy, STREAM_REQUEST, headers={"Authorization": "Bearer sk-1"})
        wait_until(lambda: recorder.calls, 10, "the event")
    assert set(recorder.calls[0][2]) == {"arrival_s"}


def test_a_request_body_over_the_limit_gets_413(loop: Loop) -> None:
    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()

    with proxied(loop, engine, max_body_bytes=1000) as (upstream, proxy):
        response, _body = post(proxy, b'{"model": "m", "prompt": "' + b"p" * 2000 + b'"}')
    assert response.status == 413
    assert upstream.requests == []


def test_a_slow_recorder_bounds_the_events_waiting_never_the_responses(loop: Loop) -> None:
    """The recorder blocks (a builder stuck on a huge history): responses go on, the events
    queued behind it are bounded by --max-pending bytes, the one beyond is dropped, counted."""
    release = threading.Event()

    class Stuck(Recorded):
        def record(self, request: Any, response: Any = None, **context: Any) -> None:
            release.wait(10)
            super().record(request, response, **context)

    async def engine(_request: bytes, _reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(SSE_HEAD + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    big = json.dumps(
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "h" * 40_000}],
        }
    ).encode()
    recorder = Stuck()
    with proxied(loop, engine, recorder, max_pending_bytes=100_000) as (_upstream, proxy):
        statuses = [post(proxy, big)[0].status for _ in range(3)]  # all while the worker is stuck
        dropped = proxy.tap.counts["events_dropped_backlog"]
        release.set()
        wait_until(lambda: len(recorder.calls) == 2, 10, "the two queued events")
    assert statuses == [200, 200, 200]
    assert dropped == 1
