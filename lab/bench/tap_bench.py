"""What ``kvcast tap`` adds to a request and to a stream, against the same sent straight upstream.

Three processes on loopback, so that no two share an event loop: the OpenAI-compatible
stand-in (``openai_standin --bench``: no model, it answers at once; with the tap's collector
settings, see ``main``), the tap in front of it
(``python -m kvcast.lab.bench.tap_bench --serve``: the real :class:`~kvcast.daemon.tap.Tap`
served as ``kvcast tap`` serves it; it builds each event with ``EventBuilder`` and drops it, so
Kafka's cost is not in the figures), and this process, the client. On 2 cores the three share
the CPUs: the figures through the tap include the tap's share of them.

- **Requests**: ``requests`` sequential non-streamed chat requests over one kept-alive
  connection, straight and through the tap, interleaved in rounds: median and p99.
- **Streams**: ``streams`` concurrent streams (raw sockets, one connection each), each of
  ``words`` chunks ``word_interval_s`` apart. The stand-in holds every stream after its first
  word until all are open at once (so they really are concurrent), then sends the rest out of
  step. First byte: from sending the request to reading the first chunk. Chunk latency: from
  the stand-in writing a chunk (its ``time.monotonic()``, stamped in the chunk: one clock for
  every process of the machine) to this client reading it. Straight and through the tap,
  interleaved in rounds. Memory per open stream: the tap process's RSS while all streams are
  open, less its RSS before, over the number of streams.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcast.daemon.gc_tuning import latency_tuned, tune_for_latency
from kvcast.lab.bench.processes import free_port, wait_until
from kvcast.producer import EventBuilder

STAMP = re.compile(rb'"sent_s": ([0-9.]+)')
GOAL_P50_S, GOAL_P99_S = 1e-3, 5e-3  # issue 32: added latency at 1,000 streams


class _BuildAndDrop:
    def __init__(self) -> None:
        self.builder = EventBuilder(b"benchmark-secret-of-32-bytes!!!!")
        self.events = 0

    def record(self, request: Mapping[str, Any], response: Mapping[str, Any] | None = None,
               **context: Any) -> None:  # fmt: skip
        self.builder.build(request, response, arrival_s=context.get("arrival_s"))
        self.events += 1


@dataclass(frozen=True)
class TapBenchResult:
    """Seconds (latencies) and bytes (memory), straight to the stand-in and through the tap."""

    requests: int
    direct_median_s: float
    tap_median_s: float
    direct_p99_s: float
    tap_p99_s: float
    streams: int
    chunks: int
    direct_first_byte_p50_s: float
    tap_first_byte_p50_s: float
    direct_first_byte_p99_s: float
    tap_first_byte_p99_s: float
    direct_chunk_p50_s: float
    tap_chunk_p50_s: float
    direct_chunk_p99_s: float
    tap_chunk_p99_s: float
    tap_rss_per_stream_bytes: float
    tap_cpu_per_chunk_s: float
    chunk_rate_per_s: float

    def rows(self) -> list[tuple[str, str, str, str]]:
        def row(name: str, tap: float, direct: float, goal: float | None) -> tuple[str, ...]:
            added = (tap - direct) * 1e3
            verdict = "" if goal is None else f" (goal < {goal * 1e3:g} ms)"
            return (name, f"{tap * 1e3:.2f} ms", f"{direct * 1e3:.2f} ms (straight to the server)",
                    f"+{added:.2f} ms{verdict}")  # fmt: skip

        n = f"{self.streams:,} streams"
        return [
            row("kvcast tap, chat request (median)", self.tap_median_s, self.direct_median_s, None),
            row("kvcast tap, chat request (p99)", self.tap_p99_s, self.direct_p99_s, None),
            row(f"kvcast tap, {n}, first byte (p50)", self.tap_first_byte_p50_s,
                self.direct_first_byte_p50_s, GOAL_P50_S),
            row(f"kvcast tap, {n}, first byte (p99)", self.tap_first_byte_p99_s,
                self.direct_first_byte_p99_s, GOAL_P99_S),
            row(f"kvcast tap, {n}, chunk latency (p50)", self.tap_chunk_p50_s,
                self.direct_chunk_p50_s, GOAL_P50_S),
            row(f"kvcast tap, {n}, chunk latency (p99)", self.tap_chunk_p99_s,
                self.direct_chunk_p99_s, GOAL_P99_S),
            (f"kvcast tap, {n}, memory per open stream",
             f"{self.tap_rss_per_stream_bytes / 1024:.1f} KiB",
             "tap RSS with every stream open, less before", f"{self.streams:,} open at once"),
            (f"kvcast tap, {n}, CPU per relayed chunk",
             f"{self.tap_cpu_per_chunk_s * 1e6:.0f} us",
             f"tap CPU time / chunks (connections, requests, events included), at "
             f"{self.chunk_rate_per_s:,.0f} chunks/s",
             f"one core: ~{1 / self.tap_cpu_per_chunk_s:,.0f} chunks/s"),
        ]  # type: ignore[return-value]  # fmt: skip

    def to_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(port: int, body: bytes, count: int) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            connection.request("POST", "/v1/chat/completions", body,
                               {"Content-Type": "application/json"})  # fmt: skip
            response = connection.getresponse()
            response.read()
            times.append(time.perf_counter() - started)
            if response.status != 200:
                raise RuntimeError(f"benchmark request answered {response.status}")
    finally:
        connection.close()
    return times


async def _streams(port: int, count: int, words: int, ramp_s: float,
                   on_all_open: Any) -> tuple[list, list]:  # fmt: skip
    """``count`` concurrent streams to ``port``, started evenly over ``ramp_s`` seconds (a
    herd of 1,000 connects in one instant would time the accept queue, not the proxy):
    (first-byte seconds, chunk seconds)."""
    body = json.dumps(
        {
            "model": "m",
            "stream": True,
            "max_tokens": words,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Tell me a story. " * 8}],
        }
    )
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
               f"application/json\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
               f"{body}").encode()  # fmt: skip
    first: list[float] = []
    chunks: list[float] = []
    started = asyncio.Event()
    opened = 0

    async def one(position: int) -> None:
        nonlocal opened
        await asyncio.sleep(position * ramp_s / count)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            sent = time.monotonic()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"benchmark stream answered {head[:40]!r}")
            seen = 0  # stamped chunks so far
            raw = events = b""  # chunked framing not yet decoded; decoded, not yet complete
            done = False
            while not done:
                data = await reader.read(65536)
                now = time.monotonic()
                if not data:
                    break
                raw += data
                while True:  # decode the chunked framing (the tap re-chunks as it relays)
                    line_end = raw.find(b"\r\n")
                    if line_end < 0:
                        break
                    size = int(raw[:line_end].split(b";")[0], 16)
                    if len(raw) < line_end + 2 + size + 2:
                        break
                    events += raw[line_end + 2 : line_end + 2 + size]
                    raw = raw[line_end + 4 + size :]
                    done = size == 0
                last = events.rfind(b"\n\n")
                complete = last + 2 if last >= 0 else 0
                for stamp in STAMP.findall(events[:complete]):
                    seen += 1
                    if seen == 1:
                        first.append(now - sent)
                        opened += 1
                        if opened == count:
                            started.set()
                    elif seen > 2:  # the 2nd (first word) was sent while streams still opened
                        chunks.append(now - float(stamp))
                done = done or b"[DONE]" in events[:complete]
                events = events[complete:]
        finally:
            writer.close()

    async def watch() -> None:
        await started.wait()
        on_all_open()

    watcher = asyncio.create_task(watch())
    await asyncio.gather(*(one(position) for position in range(count)))
    watcher.cancel()
    return first, chunks


def _spawn(args: list[str], port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)  # fmt: skip

    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{args[0]} exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
        except OSError:
            return False
        return True

    wait_until(listening, 20, f"{args[0]} on port {port}")
    return process


def run_tap_bench(requests: int = 1000, streams: int = 1000, words: int = 8,
                  word_interval_s: float = 0.5, ramp_s: float = 2.0,
                  rounds: int = 2) -> TapBenchResult:  # fmt: skip
    """The figures (see the module's docstring); about 35 s at the defaults on 2 cores. At the
    defaults 1,000 streams make 2,000 chunks/s (``streams / word_interval_s``)."""
    upstream_port, tap_port = free_port(), free_port()
    standin = _spawn(["kvcast.lab.bench.tap_bench", "--standin", "--bench", "--listen",
                      f"127.0.0.1:{upstream_port}", "--hold-until-open", str(streams),
                      "--word-interval", str(word_interval_s)], upstream_port)  # fmt: skip
    tap = None
    try:
        tap = _spawn(["kvcast.lab.bench.tap_bench", "--serve", "--listen",
                      f"127.0.0.1:{tap_port}", "--upstream", f"127.0.0.1:{upstream_port}"],
                     tap_port)  # fmt: skip
        history = [{"role": "system", "content": "You are helpful. " * 40},
                   {"role": "user", "content": "What is the capital of France? " * 4}]  # fmt: skip
        plain = json.dumps({"model": "m", "messages": history}).encode()
        _timed(tap_port, plain, 50)  # warm-up: imports, pools, the builder
        base_rss = _rss_bytes(tap.pid)
        open_rss: list[int] = []
        direct: list[float] = []
        tapped: list[float] = []
        first = {"direct": [], "tap": []}
        chunks = {"direct": [], "tap": []}
        tap_cpu = 0.0
        stream_s = 0.0
        for _ in range(rounds):  # interleaved, so that drift hits both alike
            direct += _timed(upstream_port, plain, requests // rounds)
            tapped += _timed(tap_port, plain, requests // rounds)
            for name, port in (("direct", upstream_port), ("tap", tap_port)):
                sample = (lambda: open_rss.append(_rss_bytes(tap.pid))) if name == "tap" else (
                    lambda: None)  # fmt: skip
                cpu, began = _cpu_s(tap.pid), time.monotonic()
                with latency_tuned():  # `kvcast bench`'s large young generation paused the
                    # client 30-50 ms at a time with 1,000 streams open: both sides' p99
                    f, c = asyncio.run(_streams(port, streams, words, ramp_s, sample))
                if name == "tap":
                    tap_cpu += _cpu_s(tap.pid) - cpu
                    stream_s += time.monotonic() - began
                first[name] += f
                chunks[name] += c
    finally:
        for process in (tap, standin):
            if process is not None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
    return TapBenchResult(
        requests=len(direct),
        direct_median_s=statistics.median(direct),
        tap_median_s=statistics.median(tapped),
        direct_p99_s=_p(direct, 99),
        tap_p99_s=_p(tapped, 99),
        streams=streams,
        chunks=len(chunks["tap"]),
        direct_first_byte_p50_s=_p(first["direct"], 50),
        tap_first_byte_p50_s=_p(first["tap"], 50),
        direct_first_byte_p99_s=_p(first["direct"], 99),
        tap_first_byte_p99_s=_p(first["tap"], 99),
        direct_chunk_p50_s=_p(chunks["direct"], 50),
        tap_chunk_p50_s=_p(chunks["tap"], 50),
        direct_chunk_p99_s=_p(chunks["direct"], 99),
        tap_chunk_p99_s=_p(chunks["tap"], 99),
        tap_rss_per_stream_bytes=(max(open_rss) - base_rss) / streams,
        # every stamped chunk, the two not timed included, plus the finish, usage and [DONE]
        tap_cpu_per_chunk_s=tap_cpu / (rounds * streams * (words + 4)),
        chunk_rate_per_s=rounds * streams * (words + 4) / stream_s,
    )


def main() -> None:
    """``python -m kvcast.lab.bench.tap_bench --serve --listen H:P --upstream H:P``: the tap
    the benchmark times (events built and dropped). ``... --standin ARGS``: the stand-in
    (``openai_standin ARGS``) with the tap's collector settings: with the defaults, its full
    collections over 1,000 open streams put a 40-60 ms p99 into the straight first byte too,
    and the figures compared two noise floors."""
    from kvcast.daemon.tap import Tap, run_tap

    if sys.argv[1:2] == ["--standin"]:
        from kvcast.lab.bench import openai_standin

        sys.argv = ["openai_standin", *sys.argv[2:]]
        tune_for_latency()
        openai_standin.main()
        return
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    run_tap(Tap(f"http://{args.upstream}", _BuildAndDrop()), host, int(port))


if __name__ == "__main__":
    main()
