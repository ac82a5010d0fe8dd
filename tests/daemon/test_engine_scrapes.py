"""``--engine-metrics`` against endpoints that misbehave: each is isolated, counted and bounded.

The hostile endpoints are raw-socket servers of the tests' own, standing in for what a real
fleet serves by accident or on purpose: a port taken over by another protocol (an SSH banner), a
proxy that answers with hundreds of headers, a broken chunked encoder, an overloaded engine that
drips its reply a byte at a time, and engines whose exposition carries impossible values or a
model name that changes on every scrape.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvcast.daemon.engine_metrics import EngineScraper, engine_capacity
from kvcast.daemon.engine_metrics.scraper import STALE_AFTER_FAILURES
from kvcast.lab.bench.processes import DaemonProcess, wait_until
from tests.daemon.test_engine_metrics import Endpoint, VllmMetrics, sglang_text

Behaviour = Callable[[socket.socket], None]


class RawEndpoint:
    """A TCP server that reads a request's head and then runs ``behaviour`` on the socket.

    ``connections`` counts the connections accepted, ``open`` those not yet closed by the
    client; each connection runs in a thread of its own.
    """

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.connections = 0
        self.open = 0
        self.closed = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            self.behaviour(conn)
        except OSError:  # the scraper hung up: what the deadline is for
            pass
        finally:
            conn.close()
            with self._lock:
                self.open -= 1

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


def ssh_banner(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")


def hundreds_of_headers(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)))
    conn.sendall(b"\r\nvllm:x 1\n")


def bad_chunk(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nnot a chunk\r\n")


def answer(text: str) -> Behaviour:
    """A well-formed reply with ``text``, whatever the path."""
    body = text.encode()

    def reply(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    return reply


def drip(conn: socket.socket) -> None:
    """A valid reply, one byte every 0.1 s: never silent long enough for a per-read timeout."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"#" * 100_000
    for byte in reply:
        conn.sendall(bytes([byte]))
        time.sleep(0.1)


@pytest.fixture
def raw_endpoints() -> Iterator[Callable[[Behaviour], RawEndpoint]]:
    made: list[RawEndpoint] = []

    def make(behaviour: Behaviour) -> RawEndpoint:
        made.append(RawEndpoint(behaviour))
        return made[-1]

    yield make
    for endpoint in made:
        endpoint.close()


def counted(scraper: EngineScraper, url: str) -> dict[str, int]:
    return {
        error["reason"]: error["count"]
        for error in scraper.metrics()["engine_scrape_errors"]
        if error["engine"] == url
    }


class CountingEndpoint(Endpoint):
    """The healthy engine: counts the scrapes it has served."""

    def __init__(self, text: Callable[[], str]) -> None:
        self.served = 0

        def counting() -> str:
            self.served += 1
            return text()

        super().__init__(counting)


def test_a_dripping_or_broken_endpoint_delays_no_other_and_every_failure_is_counted(
    raw_endpoints,
) -> None:
    healthy = CountingEndpoint(lambda: sglang_text(gauge=0.25))
    dripping = raw_endpoints(drip)
    broken = [raw_endpoints(b) for b in (ssh_banner, hundreds_of_headers, bad_chunk)]
    # The deadline (10 s) is far longer than the healthy engine needs for ten scrapes: they
    # must all happen while the dripping endpoint's first scrape is still going on.
    scraper = EngineScraper(
        [healthy.url, dripping.url, *(b.url for b in broken)], interval_s=0.05, timeout_s=10.0
    ).start()
    try:
        wait_until(lambda: healthy.served >= 10, 9, "ten scrapes of the healthy engine")
        assert dripping.connections == 1 and dripping.open == 1  # still its first scrape
        ratios = {(e["engine"], e["model"]): e["hit_ratio"] for e in scraper.metrics()["engines"]}
        assert ratios == {(healthy.url, "qwen"): 0.25}
        # Each broken endpoint failed more than once: its thread survived the first failure.
        wait_until(
            lambda: all(counted(scraper, b.url).get("protocol", 0) >= 2 for b in broken),
            9,
            "two protocol errors from each broken endpoint",
        )
        states = scraper.metrics()["engine_states"]
        assert "BadStatusLine" in states[broken[0].url]
        assert "more than 100 headers" in states[broken[1].url]
        assert "IncompleteRead" in states[broken[2].url]
    finally:
        scraper.close()
        healthy.close()


def test_a_scrape_ends_at_its_deadline_however_the_peer_drips(raw_endpoints) -> None:
    dripping = raw_endpoints(drip)
    scraper = EngineScraper([dripping.url], timeout_s=0.5)
    done = threading.Event()
    result: list[bool] = []
    threading.Thread(
        target=lambda: (result.append(scraper.scrape_endpoint(dripping.url)), done.set()),
        daemon=True,
    ).start()
    # A per-read timeout never fires on a byte every 0.1 s; the whole reply takes 10,000 s.
    assert done.wait(10), "the scrape outlived its deadline"
    assert result == [False]
    assert counted(scraper, dripping.url) == {"timeout": 1}
    wait_until(lambda: dripping.open == 0, 5, "the scraper to hang up on the dripping peer")


def exposition(*lines: str) -> Callable[[], str]:
    return lambda: "".join(line + "\n" for line in lines)


def test_impossible_values_are_rejected_and_counted_never_exported() -> None:
    endpoint = Endpoint(
        exposition(
            "# TYPE sglang:cache_hit_rate gauge",
            'sglang:cache_hit_rate{model_name="five"} 5.0',
            'sglang:cache_hit_rate{model_name="inf"} +Inf',
            'sglang:cache_hit_rate{model_name="nan"} NaN',
            'sglang:cache_hit_rate{model_name="fine"} 0.5',
            "# TYPE vllm:prefix_cache_hits_total counter",
            'vllm:prefix_cache_hits_total{model_name="more"} 300',
            'vllm:prefix_cache_hits_total{model_name="nancount"} NaN',
            "# TYPE vllm:prefix_cache_queries_total counter",
            'vllm:prefix_cache_queries_total{model_name="more"} 100',
            'vllm:prefix_cache_queries_total{model_name="nancount"} 100',
        )
    )
    try:
        scraper = EngineScraper([endpoint.url], timeout_s=2)
        assert scraper.scrape_endpoint(endpoint.url)
        report = scraper.metrics()
        assert report["engines"] == [{"engine": endpoint.url, "model": "fine", "hit_ratio": 0.5}]
        assert counted(scraper, endpoint.url) == {"bad_value": 5}
    finally:
        endpoint.close()


def test_a_stale_engine_is_withdrawn_after_the_stated_number_of_failures() -> None:
    metrics = VllmMetrics()
    metrics.serve("llama", queries=100, hits=50)
    answering = [True]

    def text() -> str:
        if not answering[0]:
            raise RuntimeError("the engine's exporter broke")  # the handler answers 500
        return metrics.text()

    endpoint = Endpoint(text)
    try:
        scraper = EngineScraper([endpoint.url], timeout_s=2)
        assert scraper.scrape_endpoint(endpoint.url)
        answering[0] = False
        for _ in range(STALE_AFTER_FAILURES - 1):
            assert not scraper.scrape_endpoint(endpoint.url)
            assert [e["model"] for e in scraper.metrics()["engines"]] == ["llama"]
        assert not scraper.scrape_endpoint(endpoint.url)
        assert scraper.metrics()["engines"] == []
        assert "withdrawn" in scraper.metrics()["engine_states"][endpoint.url]
        answering[0] = True
        assert scraper.scrape_endpoint(endpoint.url)
        assert [e["model"] for e in scraper.metrics()["engines"]] == ["llama"]
    finally:
        endpoint.close()


def test_models_that_vanish_are_pruned_and_urls_on_one_port_are_two_engines() -> None:
    scrapes = [0]

    def renamed_every_scrape() -> str:
        scrapes[0] += 1
        return f'sglang:cache_hit_rate{{model_name="m{scrapes[0]}"}} 0.5\n'

    endpoint = Endpoint(renamed_every_scrape)
    try:
        scraper = EngineScraper([endpoint.url], timeout_s=2)
        for _ in range(12):
            assert scraper.scrape_endpoint(endpoint.url)
        assert [e["model"] for e in scraper.metrics()["engines"]] == ["m12"]
    finally:
        endpoint.close()
    # One server answering every path; two URLs on one host:port are two engines.
    base = RawEndpoint(answer('sglang:cache_hit_rate{model_name="q"} 0.25\n'))
    try:
        first, second = base.url.replace("/metrics", "/a"), base.url.replace("/metrics", "/b")
        scraper = EngineScraper([first, second], timeout_s=2)
        scraper.scrape_once()
        assert {e["engine"] for e in scraper.metrics()["engines"]} == {first, second}
    finally:
        base.close()


def test_credentials_and_query_stay_out_of_the_engine_label() -> None:
    endpoint = RawEndpoint(answer('sglang:cache_hit_rate{model_name="q"} 0.25\n'))
    try:
        url = f"http://user:s3cret@127.0.0.1:{endpoint.port}/metrics?token=t0ken"
        scraper = EngineScraper([url], timeout_s=2)
        assert scraper.scrape_endpoint(url)
        (engine,) = scraper.metrics()["engines"]
        assert engine["engine"] == endpoint.url
    finally:
        endpoint.close()


def run_print_config(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcast.cli.main", "run", *flags, "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("behaviour", [ssh_banner, hundreds_of_headers, drip])
def test_start_up_with_a_bad_endpoint_is_one_clear_error_or_starts_with_the_capacity_given(
    raw_endpoints, behaviour
) -> None:
    bad = raw_endpoints(behaviour)
    result = run_print_config("--engine-metrics", bad.url)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1 and bad.url in error_lines[0], result.stderr
    assert "give --capacity-blocks and --block-size" in error_lines[0]
    given = run_print_config(
        "--engine-metrics", bad.url, "--capacity-blocks", "2275", "--block-size", "16"
    )
    assert given.returncode == 0, given.stderr


def test_start_up_reads_every_endpoint_at_once_within_one_deadline(raw_endpoints) -> None:
    """Two dripping endpoints cost one deadline, not two: they are read side by side."""
    drips = [raw_endpoints(drip), raw_endpoints(drip)]
    with pytest.raises(ValueError) as error:
        engine_capacity([d.url for d in drips], timeout_s=1.0)
    message = str(error.value)
    assert all(f"{d.url}: no whole reply within 1 s" in message for d in drips), message
    assert all(d.connections == 1 for d in drips)


def test_kvcast_run_exports_scrape_errors_beside_the_healthy_engines_ratio(
    raw_endpoints, tmp_path: Path
) -> None:
    metrics = VllmMetrics()

    def serving() -> str:  # requests before each scrape: an idle engine has no ratio
        metrics.serve("llama", queries=200, hits=70)
        return metrics.text()

    healthy = Endpoint(serving)
    broken = raw_endpoints(ssh_banner)
    daemon = DaemonProcess(
        ["--engine-metrics", f"{healthy.url},{broken.url}", "--engine-scrape-interval", "0.2",
         "--capacity-blocks", "2275", "--block-size", "16",
         "--metrics-addr", "127.0.0.1:0", "--refresh-interval", "0.3",
         "--sample-conversations", "300"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        error_line = f'kvcast_engine_scrape_errors_total{{engine="{broken.url}",reason="protocol"}}'
        ratio_line = f'kvcast_engine_hit_ratio{{engine="{healthy.url}",model="llama"}} 0.35'

        def both() -> bool:
            text = daemon.raw("/metrics").decode()
            return error_line in text and ratio_line in text

        wait_until(both, 30, "the healthy ratio and the broken endpoint's errors on /metrics")
        # Logged once, not once a scrape.
        wait_until(lambda: broken.connections >= 5, 30, "five scrapes of the broken endpoint")
        assert daemon.text().count(f"engine metrics {broken.url}: protocol") == 1
    finally:
        daemon.stop()
        healthy.close()
