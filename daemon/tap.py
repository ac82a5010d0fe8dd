"""``kvcast tap``: an OpenAI-compatible reverse proxy that turns served requests into events.

It stands in front of vLLM or SGLang (or anything that speaks their OpenAI-compatible API):
``POST /v1/chat/completions`` and ``POST /v1/completions`` are forwarded as they are, the
response is relayed to the client as it arrives (a stream chunk by chunk), and once the
response has ended the request and response become one event
(:class:`~kvcast.producer.EventBuilder`) on kvcast's topic. Every other path is passed through
untouched. Streams carry their token counts only when asked for, so the tap adds
``stream_options.include_usage`` to a streaming request that does not set it (spliced into the
client's bytes, nothing else re-encoded); the client then sees one more chunk, the usage chunk
(empty ``choices``), which OpenAI clients accept.

What a client or an engine sees is never changed by kvcast's own parsing:

- The upstream's bytes are relayed as they come (``Content-Encoding`` included: nothing is
  decoded, no ``Accept-Encoding`` is added); the event is built from a bounded copy
  (:mod:`kvcast.daemon.tap_copy`) that may give up on the event, never on the stream.
- Headers are relayed as a multi-map both ways (two ``Set-Cookie`` stay two), minus the
  hop-by-hop ones of RFC 9110 section 7.6.1 and those named in ``Connection``. No cookie jar:
  one client's cookies never reach another's request.
- Up to ``max_connections`` requests are upstream at once (aiohttp's default was 100). A
  client that hangs up cancels its upstream request at once (the engine sees the connection
  close and can stop generating); its event is still recorded with what was served and
  ``cut="client_disconnect"``. Timeouts: connect, first byte (the response's headers), idle
  between chunks; none on the total. An unreachable or failing upstream gives 502, a timeout
  before the response started 504; after it started, the client's connection is closed
  mid-body (so it can tell) and the event says ``cut="upstream_error"`` or ``"timeout"``.
- Events are built on one worker thread (the builder's hashing is CPU), except small ones when
  nothing is queued (bounded time, in order); at most ``max_pending_bytes`` of requests wait
  to be built, beyond that an event is dropped and counted, never a request delayed.
- The access log has the path, never the query string (``?api_key=...``).
- An agent's request without an intent gets one from how its response ended (the copy keeps
  the first choice's ``finish_reason`` and tool calls; :mod:`kvcast.producer.endings`): a stream
  cut before its ``finish_reason`` is ``agent_cut``.

Serve it with :meth:`Tap.start` or :func:`run_tap` (they turn on aiohttp's handler
cancellation, which is how a hang-up reaches the handler, and the query-free access log).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import ClientError, ClientSession, ClientTimeout, DummyCookieJar, TCPConnector, web
from yarl import URL

from kvcast.daemon.gc_tuning import tune_for_latency
from kvcast.daemon.tap_copy import ResponseCopy, copy_for
from kvcast.daemon.tap_http import (
    REQUEST_SET_BY_TAP,
    SKIP_AUTO_HEADERS,
    TapAccessLogger,
    bearer,
    error_reply,
    relayed_headers,
    with_include_usage,
)

log = logging.getLogger(__name__)
access_log = logging.getLogger("kvcast.tap.access")

TRACKED_PATHS = ("/v1/chat/completions", "/v1/completions")
MAX_BODY_BYTES = 64 << 20  # a request body the tap reads (larger: 413, as a server would say)
INLINE_BUILD_BYTES = 16 << 10  # requests this small are built on the loop (tens of microseconds)
LOG_EVERY_S = 10.0  # at most one warning per reason this often (the rest are counted)


class Recorder(Protocol):
    def record(
        self, request: Mapping[str, Any], response: Mapping[str, Any] | None = None, **context: Any
    ) -> None: ...


@dataclass(frozen=True)
class TapLimits:
    """The operator's limits. Timeouts in seconds (None: no limit); sizes in bytes.

    ``max_connections``: requests upstream at once (beyond: they wait for a connection).
    ``connect_timeout_s``: to open an upstream connection. ``first_byte_timeout_s``: from
    sending the request to the response's headers (a non-streamed request: its whole
    generation). ``idle_timeout_s``: between two chunks of a response. ``max_body_bytes``: a
    request body (larger: 413). ``max_event_bytes``: the copy of a response kept for its event
    (beyond: the event gives up; the relay goes on). ``max_pending_bytes``: request bodies
    waiting for the event worker (beyond: the event is dropped, counted). ``identity_headers``:
    request headers naming the user or session (the first present is the event's identity).
    """

    max_connections: int = 4096
    connect_timeout_s: float | None = 10.0
    first_byte_timeout_s: float | None = 600.0
    idle_timeout_s: float | None = 600.0
    max_body_bytes: int = MAX_BODY_BYTES
    max_event_bytes: int = 16 << 20
    max_pending_bytes: int = 256 << 20
    identity_headers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        for name in ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value}")
        for name in ("max_body_bytes", "max_event_bytes", "max_pending_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 byte, got {getattr(self, name)}")


class _RateLimitedLog:
    """Warnings at most once per ``LOG_EVERY_S`` per reason, with how many were not logged."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()
        self._lock = threading.Lock()

    def warning(self, reason: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(reason, -LOG_EVERY_S) < LOG_EVERY_S:
                self._quiet[reason] += 1
                return
            self._last[reason] = now
            quiet, self._quiet[reason] = self._quiet[reason], 0
        suffix = f" ({quiet} more since the last such line)" if quiet else ""
        log.warning(message + suffix, *args)


def _keywords_taken(recorder: Recorder) -> frozenset[str] | None:
    """The keywords the recorder's event builder takes (None: any). ``KafkaEventProducer``
    passes ``record``'s keywords on to ``builder.build``, so that signature is the one read."""
    target = getattr(getattr(recorder, "builder", None), "build", None) or recorder.record
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters)


class Tap:
    """The proxy: ``upstream`` (``http://HOST:PORT``) behind, ``recorder`` for the events.

    ``counts``: requests and events by outcome (``cut_<reason>``, ``upstream_502``,
    ``upstream_504``, ``events_recorded``, ``events_dropped_<reason>``, ``untracked``).
    """

    def __init__(
        self,
        upstream: str,
        recorder: Recorder,
        *,
        clock: Callable[[], float] = time.time,
        limits: TapLimits | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.recorder = recorder
        self.limits = limits or TapLimits()
        self.counts: Counter[str] = Counter()
        self._clock = clock
        self._session: ClientSession | None = None
        self._events: ThreadPoolExecutor | None = None
        self._pending = 0  # jobs queued on the event worker
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._stopping = False
        self._warn = _RateLimitedLog()
        self._identity = tuple(h.strip() for h in self.limits.identity_headers if h.strip())
        self._keywords = _keywords_taken(recorder)

    # -- serving ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._shutting_down)
        app.on_cleanup.append(self._stop)
        return app

    def runner(self) -> web.AppRunner:
        """A runner for :meth:`app` with what the tap relies on: handler cancellation (a client
        hang-up cancels its upstream request) and the query-free access log."""
        return web.AppRunner(self.app(), handler_cancellation=True,
                             access_log_class=TapAccessLogger, access_log=access_log)  # fmt: skip

    async def start(self, host: str, port: int) -> web.AppRunner:
        """Serve on ``host:port`` (on the running loop) until the runner's ``cleanup()``."""
        runner = self.runner()
        await runner.setup()
        backlog = max(128, self.limits.max_connections)  # a burst of clients is not refused
        await web.TCPSite(runner, host, port, backlog=backlog).start()
        return runner

    async def _start(self, _app: web.Application) -> None:
        limits = self.limits
        connector = TCPConnector(limit=limits.max_connections, limit_per_host=0)
        self._session = ClientSession(
            connector=connector,
            timeout=ClientTimeout(total=None, sock_connect=limits.connect_timeout_s),
            auto_decompress=False,
            cookie_jar=DummyCookieJar(),
        )
        self._events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvcast-tap-events")

    async def _shutting_down(self, _app: web.Application) -> None:
        self._stopping = True

    async def _stop(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
        if self._events is not None:  # build what is queued before the producer closes
            await asyncio.to_thread(self._events.shutdown, True)

    # -- one request ------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrival_s = self._clock()
        body = await request.read()
        parsed = await self._tracked(request, body)
        if parsed is not None and parsed.get("stream") is True and "stream_options" not in parsed:
            spliced = with_include_usage(body)
            if spliced is not None:
                body = spliced
        url = URL(self.upstream + (request.raw_path if request.raw_path.startswith("/")
                                   else str(request.rel_url)), encoded=True)  # fmt: skip
        headers = relayed_headers(request.headers, REQUEST_SET_BY_TAP)
        assert self._session is not None
        try:
            async with asyncio.timeout(self.limits.first_byte_timeout_s):
                upstream = await self._session.request(
                    request.method, url, headers=headers, data=body or None,
                    allow_redirects=False, skip_auto_headers=SKIP_AUTO_HEADERS,
                )  # fmt: skip
        except TimeoutError:
            self._count("upstream_504")
            self._warn.warning("504", "kvcast tap: %s %s: upstream timed out before the "
                               "response", request.method, request.path)  # fmt: skip
            return error_reply(504, "kvcast tap: the upstream did not answer in time")
        except (ClientError, OSError) as exc:
            self._count("upstream_502")
            self._warn.warning("502", "kvcast tap: %s %s: upstream failed (%s)",
                               request.method, request.path, type(exc).__name__)  # fmt: skip
            return error_reply(502, f"kvcast tap: the upstream failed ({type(exc).__name__})")
        return await self._relay(request, upstream, parsed, arrival_s, len(body))

    async def _tracked(self, request: web.Request, body: bytes) -> dict[str, Any] | None:
        """The request body as a JSON object when the path is one kvcast tracks, else None
        (passed through, no event). Large bodies are parsed off the loop."""
        if request.method != "POST" or request.path not in TRACKED_PATHS:
            return None
        try:
            if len(body) > INLINE_BUILD_BYTES:
                value = await asyncio.to_thread(json.loads, body)
            else:
                value = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            self._count("untracked")
            return None
        return value if isinstance(value, dict) else None

    async def _relay(self, request: web.Request, upstream: Any, parsed: dict[str, Any] | None,
                     arrival_s: float, size: int) -> web.StreamResponse:  # fmt: skip
        """Relay the upstream's response as it arrives; ``size``: the request body's bytes."""
        tracked = parsed is not None and upstream.status == 200
        copy = (copy_for(upstream.headers.get("Content-Type"),
                         upstream.headers.get("Content-Encoding"), self.limits.max_event_bytes)
                if tracked else None)  # fmt: skip
        reply = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        reply.headers.extend(relayed_headers(upstream.headers))
        cut: str | None = None
        loop = asyncio.get_running_loop()
        idle = self.limits.idle_timeout_s
        try:
            await reply.prepare(request)
            async with asyncio.timeout(None) as deadline:
                while True:
                    if idle is not None:
                        deadline.reschedule(loop.time() + idle)
                    try:
                        chunk = await upstream.content.readany()
                    except ClientError as exc:
                        cut = "upstream_error"
                        self._warn.warning("cut", "kvcast tap: %s %s: upstream failed mid-"
                                           "response (%s)", request.method, request.path,
                                           type(exc).__name__)  # fmt: skip
                        break
                    if not chunk:
                        break
                    deadline.reschedule(None)
                    try:
                        await reply.write(chunk)
                    except ConnectionError:  # the client is gone (the write could not go out)
                        cut = "client_disconnect"
                        break
                    if copy is not None:
                        copy.feed(chunk)
        except TimeoutError:
            cut = "timeout"
            self._warn.warning("timeout", "kvcast tap: %s %s: upstream idle for over %s s, "
                               "response cut", request.method, request.path, idle)  # fmt: skip
        except ConnectionError:  # prepare() to a client already gone
            cut = "client_disconnect"
        except asyncio.CancelledError:  # the client hung up (or the tap is stopping)
            cut = "shutdown" if self._stopping else "client_disconnect"
            raise
        finally:
            if cut is None:
                upstream.release()
            else:  # drop the upstream connection: the engine sees it close and stops
                upstream.close()
                self._count(f"cut_{cut}")
            if copy is not None:
                self._record(request, parsed, copy, arrival_s, cut, size)  # type: ignore[arg-type]
        if cut is not None and request.transport is not None:
            # Close instead of ending the body cleanly, so the client can tell it was cut.
            request.transport.close()
        return reply

    # -- events ------------------------------------------------------------------------------

    def _context(self, request: web.Request, arrival_s: float, cut: str | None) -> dict[str, Any]:
        """``record``'s keywords: only those that are set (older builders lack some)."""
        context: dict[str, Any] = {"arrival_s": arrival_s}
        for name in self._identity:
            value = request.headers.get(name)
            if value:
                context["identity"] = value
                break
        api_key = bearer(request.headers)
        if api_key is not None:
            context["api_key"] = api_key
        if cut is not None:
            context["cut"] = cut
        if self._keywords is not None:  # an older builder: leave out what it does not take
            context = {k: v for k, v in context.items() if k in self._keywords}
        return context

    def _record(self, request: web.Request, parsed: dict[str, Any], copy: ResponseCopy,
                arrival_s: float, cut: str | None, size: int) -> None:  # fmt: skip
        if copy.gave_up is not None:
            self._dropped("gave_up", "kvcast tap: %s %s: event dropped: %s", request.method,
                          request.path, copy.gave_up)  # fmt: skip
            return
        if copy.counts_lost is not None:
            self._warn.warning("counts_lost", "kvcast tap: %s %s: recorded without token "
                               "counts: %s", request.method, request.path,
                               copy.counts_lost)  # fmt: skip
        context = self._context(request, arrival_s, cut)
        with self._lock:
            if self._pending == 0 and size <= INLINE_BUILD_BYTES and not self._stopping:
                inline = True  # nothing queued ahead: building it here keeps the order
            elif self._pending_bytes + size > self.limits.max_pending_bytes:
                inline = None
            else:
                inline = False
                self._pending += 1
                self._pending_bytes += size
        if inline is None:
            self._dropped("backlog", "kvcast tap: event dropped: over %d bytes of requests "
                          "wait for the event worker", self.limits.max_pending_bytes)  # fmt: skip
        elif inline:
            self._build(parsed, copy, context)
        else:
            assert self._events is not None
            try:
                self._events.submit(self._build, parsed, copy, context, size)
            except RuntimeError:  # the worker has stopped (the tap is closing)
                with self._lock:
                    self._pending -= 1
                    self._pending_bytes -= size
                self._dropped("stopped", "kvcast tap: event dropped: the tap has stopped")

    def _build(self, parsed: dict[str, Any], copy: ResponseCopy, context: dict[str, Any],
               size: int | None = None) -> None:  # fmt: skip
        try:
            response = copy.body()
            if response is None:
                self._dropped("gave_up", "kvcast tap: event dropped: %s", copy.gave_up)
                return
            self.recorder.record(parsed, response, **context)
            self._count("events_recorded")
        except Exception as exc:  # the recorder's fault must not reach the proxy
            self._dropped("recorder", "kvcast tap: event dropped: the recorder failed (%s)",
                          type(exc).__name__)  # fmt: skip
        finally:
            if size is not None:
                with self._lock:
                    self._pending -= 1
                    self._pending_bytes -= size

    def _count(self, key: str) -> None:
        with self._lock:  # the loop and the event worker both count
            self.counts[key] += 1

    def _dropped(self, reason: str, message: str, *args: Any) -> None:
        self._count(f"events_dropped_{reason}")
        self._warn.warning(reason, message, *args)


def run_tap(tap: Tap, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM."""
    log.info("kvcast tap: listening on %s:%d, upstream %s", host, port, tap.upstream)
    app = tap.app()
    tune_for_latency()  # after start-up has allocated what it keeps
    with contextlib.suppress(KeyboardInterrupt):
        web.run_app(app, host=host, port=port, print=None, handle_signals=True,
                    handler_cancellation=True, access_log_class=TapAccessLogger,
                    access_log=access_log,
                    backlog=max(128, tap.limits.max_connections))  # fmt: skip
