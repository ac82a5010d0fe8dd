"""``--engine-metrics``: the engines' own hit ratio and capacity, scraped over HTTP.

The endpoints are HTTP servers of the tests' own standing in for a vLLM or SGLang server's
``/metrics``: their text is made by prometheus-client (what both engines expose with), with the
metric and label names of vLLM 0.33 (``vllm/v1/metrics/loggers.py``: counters
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` labelled ``model_name`` and
``engine``, the info gauge ``vllm:cache_config_info`` with the cache config's fields as labels)
and SGLang 0.5.23 (``sglang/srt/observability/metrics_collector.py``: the gauge
``sglang:cache_hit_rate``, counters ``sglang:cached_tokens`` / ``sglang:prompt_tokens``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvcast.cli.main import cli
from kvcast.daemon.engine_metrics import (
    EngineScraper,
    HitRatioWindow,
    engine_capacity,
    parse_engine_metrics,
)
from kvcast.lab.bench.processes import DaemonProcess, wait_until


class VllmMetrics:
    """vLLM's prefix-cache counters (two engine ranks) and its cache config, as it declares
    them."""

    def __init__(self, num_gpu_blocks: int | None = 2275, block_size: int = 16) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries (tokens).", labels,
            registry=self.registry,
        )  # fmt: skip
        self.hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits (tokens).", labels, registry=self.registry
        )
        info = {"block_size": str(block_size), "num_gpu_blocks": str(num_gpu_blocks),
                "enable_prefix_caching": "True", "engine": ""}  # fmt: skip
        gauge = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                      list(info), registry=self.registry)  # fmt: skip
        gauge.labels(**info).set(1)

    def serve(self, model: str, queries: int, hits: int) -> None:
        """Half on each of the two engine ranks."""
        for engine in ("0", "1"):
            self.queries.labels(model, engine).inc(queries / 2)
            self.hits.labels(model, engine).inc(hits / 2)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def sglang_text(gauge: float | None = None, cached: float | None = None, prompt: float = 0) -> str:
    registry = CollectorRegistry()
    if gauge is not None:
        g = Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", ["model_name"],
                  registry=registry)  # fmt: skip
        g.labels("qwen").set(gauge)
    if cached is not None:
        c = Counter("sglang:cached_tokens", "Cached tokens.", ["model_name"], registry=registry)
        p = Counter("sglang:prompt_tokens", "Prompt tokens.", ["model_name"], registry=registry)
        c.labels("qwen").inc(cached)
        p.labels("qwen").inc(prompt)
    return generate_latest(registry).decode()


class Endpoint:
    """An HTTP server answering ``GET /metrics`` with whatever ``text`` returns."""

    def __init__(self, text) -> None:
        self.text = text
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.text().encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        self.name = self.url  # the engine label: the endpoint's URL
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def vllm() -> Iterator[tuple[VllmMetrics, Endpoint]]:
    metrics = VllmMetrics()
    endpoint = Endpoint(metrics.text)
    yield metrics, endpoint
    endpoint.close()


def test_vllm_counts_are_summed_over_engine_ranks_per_model() -> None:
    metrics = VllmMetrics()
    metrics.serve("llama", queries=1000, hits=400)
    metrics.serve("qwen", queries=100, hits=90)
    readings, capacities = parse_engine_metrics(metrics.text(), "e:1")
    by_model = {r.model: (r.hits, r.queries) for r in readings}
    assert by_model == {"llama": (400.0, 1000.0), "qwen": (90.0, 100.0)}
    assert [(c.num_gpu_blocks, c.block_size) for c in capacities] == [(2275, 16)]


def test_sglang_counters_win_over_its_gauge_and_the_gauge_serves_alone() -> None:
    both = sglang_text(gauge=0.9, cached=30, prompt=100)
    (reading,), _ = parse_engine_metrics(both, "e:2")
    assert (reading.hits, reading.queries, reading.ratio) == (30.0, 100.0, None)
    (reading,), _ = parse_engine_metrics(sglang_text(gauge=0.42), "e:2")
    assert reading.ratio == 0.42


def test_an_unprofiled_cache_config_gives_no_capacity() -> None:
    _, capacities = parse_engine_metrics(VllmMetrics(num_gpu_blocks=None).text(), "e:3")
    assert capacities == []


def test_the_window_is_the_increase_over_the_last_scrapes_and_survives_a_restart() -> None:
    window = HitRatioWindow(window_s=60.0)
    window.add(0.0, hits=900, queries=1000)  # since the engine started
    assert window.ratio() == pytest.approx(0.9)
    window.add(30.0, hits=910, queries=1100)
    assert window.ratio() == pytest.approx(10 / 100)
    window.add(90.0, hits=1010, queries=1200)  # the 0 s scrape left the window
    assert window.ratio() == pytest.approx((1010 - 910) / (1200 - 1100))
    window.add(100.0, hits=5, queries=10)  # a counter went down: the engine restarted
    assert window.ratio() == pytest.approx(0.5)
    assert HitRatioWindow(60.0).ratio() is None


def test_the_scraper_reports_each_model_and_each_endpoints_state(vllm) -> None:
    metrics, endpoint = vllm
    now = [0.0]
    scraper = EngineScraper([endpoint.url, "http://127.0.0.1:9/metrics"], timeout_s=1,
                            clock=lambda: now[0])  # fmt: skip
    metrics.serve("llama", queries=1000, hits=500)
    scraper.scrape_once()
    now[0] = 15.0
    metrics.serve("llama", queries=1000, hits=800)
    scraper.scrape_once()
    report = scraper.metrics()
    assert report["engines"] == [{"engine": endpoint.name, "model": "llama", "hit_ratio": 0.8}]
    assert report["engine_states"][endpoint.url] == "ok"
    assert report["engine_states"]["http://127.0.0.1:9/metrics"].startswith("unavailable: ")


def test_capacity_comes_from_the_vllm_endpoints(vllm) -> None:
    _metrics, endpoint = vllm
    other = Endpoint(VllmMetrics(num_gpu_blocks=2275).text)
    try:
        assert engine_capacity([endpoint.url, other.url]) == (2275, 16, 2)
    finally:
        other.close()
    sglang = Endpoint(lambda: sglang_text(gauge=0.5))
    try:
        with pytest.raises(ValueError, match="give --capacity-blocks and --block-size") as exc:
            engine_capacity([sglang.url, "http://127.0.0.1:9/metrics"], timeout_s=1)
        assert f"{sglang.url}: no vllm:cache_config_info" in str(exc.value)
        assert "http://127.0.0.1:9/metrics: " in str(exc.value)
    finally:
        sglang.close()


def test_run_refuses_an_engine_url_that_is_not_http() -> None:
    result = CliRunner().invoke(cli, ["run", "--engine-metrics", "redis://x:1", "--print-config"])
    assert result.exit_code != 0
    assert "engine_metrics 'redis://x:1': expected http://HOST:PORT/metrics" in result.output


def test_kvcast_run_exports_the_engines_ratio_and_forecasts_their_capacity(
    vllm, tmp_path: Path
) -> None:
    metrics, endpoint = vllm
    # A batch of requests before each scrape, so that every window has traffic: an idle
    # engine has no ratio over its window (no queries added since its first scrape in it).
    batch = {"queries": 100, "hits": 35}

    def serving() -> str:
        metrics.serve("llama", **batch)
        return metrics.text()

    endpoint.text = serving
    daemon = DaemonProcess(
        ["--engine-metrics", endpoint.url, "--engine-scrape-interval", "0.2",
         "--metrics-addr", "127.0.0.1:0", "--refresh-interval", "0.3",
         "--sample-conversations", "300"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    ratio = re.compile(rf'^kvcast_engine_hit_ratio{{engine="{endpoint.name}",model="llama"}} (.+)$',
                       re.M)  # fmt: skip

    def exported() -> float | None:
        found = ratio.search(daemon.raw("/metrics").decode())
        return float(found.group(1)) if found else None

    try:
        wait_until(exported, 30, "kvcast_engine_hit_ratio on /metrics")
        assert exported() == pytest.approx(0.35)
        text = daemon.raw("/metrics").decode()
        assert re.search(r"^kvcast_capacity_blocks 2275\.0$", text, re.M)
        assert "from the engines' vllm:cache_config_info: capacity_blocks=2275" in daemon.text()
        batch.update(hits=100)  # from now on every query hits: the window's ratio rises
        wait_until(lambda: (exported() or 0) > 0.36, 30, "a ratio of the hits since")
    finally:
        daemon.stop()


def test_flags_given_win_over_the_engines_capacity(vllm) -> None:
    _metrics, endpoint = vllm

    def resolved(*flags: str) -> dict:
        result = CliRunner().invoke(
            cli, ["run", "--engine-metrics", endpoint.url, *flags, "--print-config"]
        )
        assert result.exit_code == 0, result.output
        return orjson.loads(result.output)

    taken = resolved()
    assert (taken["capacity_blocks"], taken["stats"]["block_size"], taken["instances"]) == (
        2275, 16, 1)  # fmt: skip
    given = resolved("--capacity-blocks", "99", "--block-size", "32", "--instances", "4")
    assert (given["capacity_blocks"], given["stats"]["block_size"], given["instances"]) == (
        99, 32, 4)  # fmt: skip
    partly = resolved("--capacity-blocks", "99")
    assert (partly["capacity_blocks"], partly["stats"]["block_size"]) == (99, 16)
