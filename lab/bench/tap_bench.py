"""What ``kvcast tap`` adds to a request, against the same requests sent straight upstream.

One process: the OpenAI-compatible stand-in (``openai_standin``, no model: it answers at once,
so the figures are the proxy's cost, not the engine's) and the tap in front of it, on one
event-loop thread; the tap builds each event (``EventBuilder``: history hashes, block hashes)
and drops it, so Kafka's cost is not in the figures. A client sends ``requests`` sequential
chat requests over one kept-alive connection, straight and through the tap, interleaved in
rounds; then the same for streams (the stand-in spaces words 10 ms apart: time to the last byte).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kvcast.daemon.tap import Tap
from kvcast.lab.bench.openai_standin import standin_app
from kvcast.lab.bench.processes import free_port
from kvcast.producer import EventBuilder


class _BuildAndDrop:
    def __init__(self) -> None:
        self.builder = EventBuilder(b"benchmark-secret-of-32-bytes!!!!")
        self.events = 0

    def record(self, request: Mapping[str, Any], response: Mapping[str, Any] | None = None,
               **context: Any) -> None:  # fmt: skip
        self.builder.build(request, response, **context)
        self.events += 1


@dataclass(frozen=True)
class TapBenchResult:
    """Seconds per request, straight to the stand-in and through the tap."""

    direct_median_s: float
    tap_median_s: float
    direct_p99_s: float
    tap_p99_s: float
    direct_stream_median_s: float
    tap_stream_median_s: float
    requests: int

    def rows(self) -> list[tuple[str, str, str, str]]:
        added = (self.tap_median_s - self.direct_median_s) * 1e3
        return [
            ("kvcast tap, chat request (median)", f"{self.tap_median_s * 1e3:.2f} ms",
             f"{self.direct_median_s * 1e3:.2f} ms (straight to the server)",
             f"+{added:.2f} ms"),
            ("kvcast tap, chat request (p99)", f"{self.tap_p99_s * 1e3:.2f} ms",
             f"{self.direct_p99_s * 1e3:.2f} ms (straight to the server)",
             f"+{(self.tap_p99_s - self.direct_p99_s) * 1e3:.2f} ms"),
            ("kvcast tap, streamed chat (median, last byte)",
             f"{self.tap_stream_median_s * 1e3:.2f} ms",
             f"{self.direct_stream_median_s * 1e3:.2f} ms (straight to the server)",
             f"+{(self.tap_stream_median_s - self.direct_stream_median_s) * 1e3:.2f} ms"),
        ]  # fmt: skip

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items()}


def _serve(loop: asyncio.AbstractEventLoop, app: web.Application, port: int) -> web.AppRunner:
    async def start() -> web.AppRunner:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    return asyncio.run_coroutine_threadsafe(start(), loop).result(10)


def _timed(port: int, bodies: list[bytes]) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times = []
    try:
        for body in bodies:
            started = time.perf_counter()
            connection.request("POST", "/v1/chat/completions", body,
                               {"Content-Type": "application/json"})  # fmt: skip
            response = connection.getresponse()
            response.read()
            times.append(time.perf_counter() - started)
            assert response.status == 200
    finally:
        connection.close()
    return times


def run_tap_bench(requests: int = 2000, streams: int = 40, rounds: int = 4) -> TapBenchResult:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    upstream_port, tap_port = free_port(), free_port()
    runners = [_serve(loop, standin_app(), upstream_port)]
    runners.append(_serve(loop, Tap(f"http://127.0.0.1:{upstream_port}", _BuildAndDrop()).app(),
                          tap_port))  # fmt: skip
    history = [{"role": "system", "content": "You are helpful. " * 40},
               {"role": "user", "content": "What is the capital of France? " * 4}]  # fmt: skip
    plain = json.dumps({"model": "m", "messages": history}).encode()
    streamed = json.dumps({"model": "m", "messages": history, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    direct: list[float] = []
    tapped: list[float] = []
    direct_stream: list[float] = []
    tapped_stream: list[float] = []
    try:
        for _ in range(rounds):  # interleaved, so that drift hits both alike
            direct += _timed(upstream_port, [plain] * (requests // rounds))
            tapped += _timed(tap_port, [plain] * (requests // rounds))
            direct_stream += _timed(upstream_port, [streamed] * (streams // rounds))
            tapped_stream += _timed(tap_port, [streamed] * (streams // rounds))
    finally:
        for runner in runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    def p99(values: list[float]) -> float:
        return statistics.quantiles(values, n=100)[98]

    return TapBenchResult(
        direct_median_s=statistics.median(direct),
        tap_median_s=statistics.median(tapped),
        direct_p99_s=p99(direct),
        tap_p99_s=p99(tapped),
        direct_stream_median_s=statistics.median(direct_stream),
        tap_stream_median_s=statistics.median(tapped_stream),
        requests=len(direct),
    )
