"""``kvcast tap``: an OpenAI-compatible reverse proxy that turns served requests into events.

It stands in front of vLLM or SGLang (or anything that speaks their OpenAI-compatible API):
``POST /v1/chat/completions`` and ``POST /v1/completions`` are forwarded as they are, the
response is relayed to the client as it arrives (a stream chunk by chunk), and once the
response has ended the request and response become one event
(:class:`~kvcast.producer.EventBuilder`) on kvcast's topic. Every other path is passed through
untouched. Streams carry their token counts only when asked for, so the tap adds
``stream_options.include_usage`` to a streaming request that does not set it; the client then
sees one more chunk, the usage chunk (empty ``choices``), which OpenAI clients accept.

Built on aiohttp (one event loop, no thread per connection). Producing never delays or fails
a response: the event is queued (``KafkaEventProducer.record``) after the response is sent.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from aiohttp import ClientSession, ClientTimeout, web

from kvcast.producer.responses import StreamedResponse, json_object

log = logging.getLogger(__name__)

TRACKED_PATHS = ("/v1/chat/completions", "/v1/completions")
# Headers that describe one hop, not the message (RFC 9110 section 7.6.1), and those aiohttp
# sets itself for the next hop.
HOP_HEADERS = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
              "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length")
)  # fmt: skip
MAX_BODY_BYTES = 64 << 20  # a request body the tap reads (larger: 413, as a server would say)


class Recorder(Protocol):
    def record(
        self, request: Mapping[str, Any], response: Mapping[str, Any] | None = None, **context: Any
    ) -> None: ...


class Tap:
    """The proxy: ``upstream`` (``http://HOST:PORT``) behind, ``recorder`` for the events."""

    def __init__(
        self,
        upstream: str,
        recorder: Recorder,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 600.0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.recorder = recorder
        self._clock = clock
        self._timeout = ClientTimeout(total=timeout_s)
        self._session: ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        self._session = ClientSession(timeout=self._timeout, auto_decompress=False)

    async def _stop(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrival_s = self._clock()
        body = await request.read()
        parsed = json_object(body) if request.method == "POST" else None
        tracked = parsed is not None and request.path in TRACKED_PATHS
        streaming = tracked and bool(parsed.get("stream"))  # type: ignore[union-attr]
        if streaming and "stream_options" not in parsed:  # type: ignore[operator]
            parsed = {**parsed, "stream_options": {"include_usage": True}}  # type: ignore[dict-item]
            body = json.dumps(parsed).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        assert self._session is not None
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            reply = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_HEADERS:
                    reply.headers[key] = value
            await reply.prepare(request)
            assembled = StreamedResponse() if streaming else None
            whole = bytearray() if tracked and not streaming else None
            async for chunk in upstream.content.iter_any():
                await reply.write(chunk)
                if assembled is not None:
                    assembled.feed(chunk)
                elif whole is not None:
                    whole += chunk
            await reply.write_eof()
        if tracked and upstream.status == 200:
            response = assembled.body() if assembled is not None else json_object(bytes(whole))
            self.recorder.record(parsed, response, arrival_s=arrival_s)  # type: ignore[arg-type]
        return reply


def run_tap(tap: Tap, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM."""
    log.info("kvcast tap: listening on %s:%d, upstream %s", host, port, tap.upstream)
    web.run_app(tap.app(), host=host, port=port, print=None, handle_signals=True)
