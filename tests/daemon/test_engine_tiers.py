"""``--engine-metrics`` per cache tier: the share of the input each tier served, as the engines
count it, exported as ``kvcast_engine_hit_ratio_tier{engine,model,tier}``.

The stand-in engines below declare their metrics as the engines' sources do (name, help text,
label names, copied) and count as the engines' code counts, with prometheus-client (what all
three expose with), so the endpoints serve the engines' own exposition text:

- vLLM 0.33.0, ``vllm/v1/metrics/loggers.py``: ``vllm:prefix_cache_queries`` /
  ``vllm:prefix_cache_hits`` and ``vllm:prompt_tokens_cached_by_source`` {model_name, engine,
  source}, every source of ``vllm/v1/metrics/cache_hit_source.py`` declared at 0 up front; the
  device tier is incremented with ``prefix_cache_stats.hits``, the others with the connector's
  ``hits_by_source`` (the KV offloading connector's CPU manager says ``host``);
- SGLang 0.5.23, ``sglang/srt/observability/metrics_collector.py``
  (``observe_one_finished_request``): ``sglang:prompt_tokens`` {model_name, engine_type,
  is_streaming}, ``sglang:cached_tokens`` {model_name, engine_type, cache_source}, a source's
  series created at its first token, ``total`` when a request has no split;
- LMCache 0.5.6, ``lmcache/observability.py`` (``PrometheusLogger``) as its vLLM v1 adapter
  counts (``lmcache/integration/vllm/vllm_v1_adapter.py``, ``start_load_kv``): per worker,
  ``lmcache:num_prompt_tokens``, ``lmcache:num_vllm_hit_tokens``, ``lmcache:num_hit_tokens`` and
  ``lmcache:num_requested_tokens`` {model_name, worker_id, role, served_model_name}.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from kvcast.daemon.engine_metrics import (
    EngineScraper,
    TierWindow,
    parse_engine_metrics,
    parse_engine_tiers,
)
from kvcast.daemon.engine_metrics.readings import MAX_TIERS_PER_MODEL
from kvcast.daemon.engine_metrics.scraper import MAX_MODELS_PER_ENGINE, STALE_AFTER_FAILURES
from kvcast.lab.bench.processes import DaemonProcess, wait_until
from tests.daemon.test_engine_metrics import Endpoint, VllmMetrics

VLLM_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")


class Vllm033:
    """vLLM 0.33.0's prefix-cache counters and hits by source, for ``ranks`` engine ranks."""

    def __init__(self, model: str = "llama", ranks: int = 2) -> None:
        self.registry, self.model, self.ranks = CollectorRegistry(), model, ranks
        labels = ["model_name", "engine"]
        self.queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels, registry=self.registry,
        )  # fmt: skip
        self.hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels, registry=self.registry,
        )  # fmt: skip
        self.by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            [*labels, "source"], registry=self.registry,
        )  # fmt: skip
        for rank in range(ranks):
            for source in VLLM_SOURCES:
                self.by_source.labels(model, str(rank), source)

    def admit(self, queries: int, device: int, **external: int) -> None:
        """Admissions of ``queries`` tokens, split evenly over the ranks: ``device`` found in
        the GPU cache, ``external`` (host=, disk=, ...) loaded by the connector."""
        for rank in map(str, range(self.ranks)):
            self.queries.labels(self.model, rank).inc(queries / self.ranks)
            self.hits.labels(self.model, rank).inc(device / self.ranks)
            self.by_source.labels(self.model, rank, "device").inc(device / self.ranks)
            for source, tokens in external.items():
                self.by_source.labels(self.model, rank, source).inc(tokens / self.ranks)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class Sglang0523:
    """SGLang 0.5.23's prompt and cached-token counters, as a finished request counts them."""

    def __init__(self, model: str = "qwen") -> None:
        self.registry, self.labels = CollectorRegistry(), {"model_name": model,
                                                           "engine_type": "unified"}  # fmt: skip
        self.prompt = Counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.",
            [*self.labels, "is_streaming"], registry=self.registry,
        )  # fmt: skip
        self.cached = Counter(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*self.labels, "cache_source"], registry=self.registry,
        )  # fmt: skip

    def finish(
        self, prompt: int, device: int = 0, host: int = 0, storage: int | None = None,
        split: bool = True, streaming: bool = False,
    ) -> None:  # fmt: skip
        """One finished request; without ``split`` its cached tokens go to ``total``."""
        self.prompt.labels(**self.labels, is_streaming=str(streaming).lower()).inc(prompt)
        cached = device + host + (storage or 0)
        if cached <= 0:
            return
        if not split:
            self.cached.labels(**self.labels, cache_source="total").inc(cached)
            return
        for source, value in (("device", device), ("host", host), ("storage", storage or 0)):
            if value > 0:
                self.cached.labels(**self.labels, cache_source=source).inc(value)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class Lmcache056:
    """LMCache 0.5.6's token counters in vLLM's workers (one ``worker_id`` per TP rank)."""

    def __init__(self, served: str = "llama", workers: int = 2) -> None:
        self.registry, self.served, self.workers = CollectorRegistry(), served, workers
        labels = ["model_name", "worker_id", "role", "served_model_name"]

        def counter(name: str, help_text: str) -> Counter:
            return Counter(name, help_text, labels, registry=self.registry)

        self.requested = counter(
            "lmcache:num_requested_tokens", "Total number of tokens requested from lmcache"
        )
        self.hit = counter("lmcache:num_hit_tokens", "Total number of tokens hit in lmcache")
        self.vllm_hit = counter("lmcache:num_vllm_hit_tokens", "Number of hit tokens in vllm")
        self.prompt = counter("lmcache:num_prompt_tokens", "Number of prompt tokens in lmcache")

    def load(self, prompt: int, vllm_cached: int, retrieved: int, requested: int) -> None:
        """One request's ``start_load_kv`` in every worker (each holds its own shard)."""
        for worker in range(self.workers):
            labels = ("/models/Llama-3.1-8B", str(worker), "worker", self.served)
            self.prompt.labels(*labels).inc(prompt)
            self.vllm_hit.labels(*labels).inc(vllm_cached)
            self.requested.labels(*labels).inc(requested)
            self.hit.labels(*labels).inc(retrieved)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def tiers_of(scraper: EngineScraper) -> dict[tuple[str, str], float]:
    return {(t["model"], t["tier"]): t["hit_ratio"] for t in scraper.metrics()["engine_tiers"]}


def errors_of(scraper: EngineScraper) -> dict[str, int]:
    return {e["reason"]: e["count"] for e in scraper.metrics()["engine_scrape_errors"]}


def scraper_on(text, clock: list[float] | None = None) -> tuple[EngineScraper, Endpoint]:
    endpoint = Endpoint(text)
    now = clock if clock is not None else [0.0]
    return EngineScraper([endpoint.url], timeout_s=2, clock=lambda: now[0]), endpoint


def test_vllm_tiers_are_shares_of_the_queried_tokens_summed_over_ranks() -> None:
    vllm = Vllm033()
    vllm.admit(1000, device=300, host=200)
    (reading,) = parse_engine_tiers(vllm.text(), "e")
    assert (reading.model, reading.source, reading.queries) == ("llama", "vllm", 1000.0)
    # Sources declared but never served (p2p, disk, external) are no tier of this engine yet.
    assert reading.hits == {"gpu": 300.0, "host": 200.0}
    # The overall ratio stays vLLM's own prefix-cache hits over queries (the GPU tier).
    (overall,), _ = parse_engine_metrics(vllm.text(), "e")
    assert (overall.hits, overall.queries) == (300.0, 1000.0)


def test_the_scraper_exports_each_tier_over_its_window() -> None:
    vllm = Vllm033()
    now = [0.0]
    scraper, endpoint = scraper_on(vllm.text, now)
    try:
        vllm.admit(1000, device=500, host=100)
        assert scraper.scrape_endpoint(endpoint.url)
        assert tiers_of(scraper) == {("llama", "gpu"): 0.5, ("llama", "host"): 0.1}
        now[0] = 15.0
        vllm.admit(1000, device=200, host=300, disk=100)  # disk serves from now on
        assert scraper.scrape_endpoint(endpoint.url)
        assert tiers_of(scraper) == pytest.approx(
            {("llama", "gpu"): 0.2, ("llama", "host"): 0.3, ("llama", "disk"): 0.1}
        )
        assert scraper.metrics()["engines"][0]["hit_ratio"] == pytest.approx(0.2)
    finally:
        endpoint.close()


def test_sglang_tiers_are_cached_tokens_by_source_over_prompt_tokens() -> None:
    sglang = Sglang0523()
    now = [0.0]
    scraper, endpoint = scraper_on(sglang.text, now)
    try:
        sglang.finish(1000, device=400)
        sglang.finish(1000, device=100, streaming=True)  # prompt tokens of both series count
        assert scraper.scrape_endpoint(endpoint.url)
        assert tiers_of(scraper) == {("qwen", "gpu"): 0.25}  # no host series yet
        now[0] = 15.0
        sglang.finish(1000, device=100, host=500, storage=200)  # HiCache L2 and L3 hits
        sglang.finish(1000, device=300, split=False)  # no split: no tier's, but a hit
        assert scraper.scrape_endpoint(endpoint.url)
        # Over the window: 2000 prompt tokens; the host and storage series appeared in it and
        # count from 0; the unsplit 300 are in no tier, so the tiers add up to less.
        assert tiers_of(scraper) == pytest.approx(
            {("qwen", "gpu"): 0.05, ("qwen", "host"): 0.25, ("qwen", "storage"): 0.1}
        )
        assert scraper.metrics()["engines"][0]["hit_ratio"] == pytest.approx(1100 / 2000)
    finally:
        endpoint.close()


def test_lmcache_tiers_are_vllm_and_lmcache_hits_over_prompt_tokens() -> None:
    lmcache = Lmcache056(served="llama", workers=2)
    lmcache.load(prompt=1024, vllm_cached=256, retrieved=512, requested=768)
    lmcache.load(prompt=1024, vllm_cached=0, retrieved=0, requested=1024)
    (reading,) = parse_engine_tiers(lmcache.text(), "e")
    # Keyed by the served name, as vLLM's model_name is; both workers counted alike.
    assert (reading.model, reading.source) == ("llama", "lmcache")
    assert reading.hits == {"gpu": 512.0, "lmcache": 1024.0}
    assert reading.queries == 4096.0


def test_lmcache_counting_a_chunk_twice_never_serves_more_than_vllm_lacks() -> None:
    """vLLM holds 992 of 1000 tokens; LMCache retrieves from the chunk boundary at 768, 232
    tokens, 224 of them already on the GPU (vllm_v1_adapter masks to the chunk below)."""
    lmcache = Lmcache056(workers=1)
    lmcache.load(prompt=1000, vllm_cached=992, retrieved=232, requested=232)
    (reading,) = parse_engine_tiers(lmcache.text(), "e")
    assert reading.hits == {"gpu": 992.0, "lmcache": 8.0}


def test_an_engines_own_split_wins_over_a_connectors() -> None:
    vllm, lmcache = Vllm033(), Lmcache056(served="llama")
    vllm.admit(1000, device=300, external_unspecified=200)  # vLLM's LMCache connector: no tier
    lmcache.load(prompt=500, vllm_cached=150, retrieved=100, requested=350)
    (reading,) = parse_engine_tiers(vllm.text() + lmcache.text(), "e")
    assert reading.source == "vllm"
    assert reading.hits == {"gpu": 300.0, "external": 200.0}


def test_the_window_of_tiers_restarts_when_a_count_goes_down() -> None:
    window = TierWindow(window_s=60.0)
    window.add(0.0, 1000, {"gpu": 500, "host": 100})
    window.add(30.0, 2000, {"gpu": 700, "host": 400})
    assert window.ratios() == pytest.approx({"gpu": 0.2, "host": 0.3})
    window.add(40.0, 100, {"gpu": 10})  # the engine restarted: everything lower
    assert window.ratios() == pytest.approx({"gpu": 0.1})
    window.add(50.0, 200, {"gpu": 20, "host": 5})
    window.add(60.0, 300, {"gpu": 30})  # host gone while the input grew: anew too
    assert window.ratios() == pytest.approx({"gpu": 0.1})
    window.add(130.0, 400, {"gpu": 100})  # the first of two scrapes stays, however old
    assert window.ratios() == pytest.approx({"gpu": 0.7})
    window.add(140.0, 500, {"gpu": 150})  # the window reaches back to the last scrape before it
    assert window.ratios() == pytest.approx({"gpu": (150 - 30) / (500 - 300)})
    window.add(200.0, 600, {"gpu": 160})  # 140 s is now that scrape (200 - 60)
    assert window.ratios() == pytest.approx({"gpu": (160 - 150) / (600 - 500)})
    assert TierWindow(60.0).ratios() == {}


def test_counters_going_backwards_restart_the_exported_tiers() -> None:
    engines = [Vllm033()]
    now = [0.0]
    scraper, endpoint = scraper_on(lambda: engines[0].text(), now)
    try:
        engines[0].admit(10_000, device=9000, host=500)
        assert scraper.scrape_endpoint(endpoint.url)
        engines[0] = Vllm033()  # restarted: its counters start at 0 again
        engines[0].admit(1000, device=100, host=600)
        now[0] = 15.0
        assert scraper.scrape_endpoint(endpoint.url)
        # Since the restart, not a negative increase over the window.
        assert tiers_of(scraper) == pytest.approx({("llama", "gpu"): 0.1, ("llama", "host"): 0.6})
        assert errors_of(scraper) == {}
    finally:
        endpoint.close()


def exposition(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


SGLANG_HEAD = (
    "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
    "# TYPE sglang:prompt_tokens_total counter",
)
CACHED_HEAD = (
    "# HELP sglang:cached_tokens_total Number of cached prompt tokens by source "
    "(device/host/storage).",
    "# TYPE sglang:cached_tokens_total counter",
)


def sglang_lines(model: str, prompt: str, **cached: str) -> list[str]:
    labels = f'engine_type="unified",model_name="{model}"'
    lines = [f'sglang:prompt_tokens_total{{{labels},is_streaming="false"}} {prompt}']
    lines += [
        f'sglang:cached_tokens_total{{cache_source="{source}",{labels}}} {value}'
        for source, value in cached.items()
    ]
    return lines


def test_impossible_tier_values_are_rejected_and_counted_never_exported() -> None:
    prompt_lines, cached_lines = [], []
    cases = {
        "nan": ("1000", {"device": "NaN"}),
        "inf": ("+Inf", {"device": "10"}),
        "negative": ("1000", {"device": "-5"}),
        "more": ("1000", {"device": "800", "host": "300"}),  # 1100 of 1000 tokens
        "fine": ("1000", {"device": "250", "host": "250"}),
    }
    for model, (prompt, cached) in cases.items():
        lines = sglang_lines(model, prompt, **cached)
        prompt_lines.append(lines[0])
        cached_lines += lines[1:]
    text = exposition(*SGLANG_HEAD, *prompt_lines, *CACHED_HEAD, *cached_lines)
    scraper, endpoint = scraper_on(lambda: text)
    try:
        assert scraper.scrape_endpoint(endpoint.url)
        assert tiers_of(scraper) == {("fine", "gpu"): 0.25, ("fine", "host"): 0.25}
        # Each impossible model twice: its overall counts and its tier counts.
        assert errors_of(scraper) == {"bad_value": 8}
    finally:
        endpoint.close()


def test_tier_counts_growing_faster_than_the_input_are_rejected_and_start_anew() -> None:
    counts = {"prompt": "1000", "device": "100"}

    def text() -> str:
        return exposition(
            *SGLANG_HEAD, sglang_lines("m", counts["prompt"])[0],
            *CACHED_HEAD, *sglang_lines("m", "0", device=counts["device"])[1:],
        )  # fmt: skip

    now = [0.0]
    scraper, endpoint = scraper_on(text, now)
    try:
        assert scraper.scrape_endpoint(endpoint.url)
        counts.update(prompt="1010", device="600")  # +500 hits for +10 tokens asked
        now[0] = 15.0
        assert scraper.scrape_endpoint(endpoint.url)
        assert errors_of(scraper) == {"bad_value": 2}  # the tiers' window and the total's
        assert tiers_of(scraper) == pytest.approx({("m", "gpu"): 600 / 1010})  # since the start
        (overall,) = scraper.metrics()["engines"]
        assert overall["hit_ratio"] == pytest.approx(600 / 1010)
    finally:
        endpoint.close()


def test_odd_tier_names_are_refused_and_counted_and_the_rest_exported() -> None:
    odd = ["GPU", "ho st", "x" * 200, 'tier\\"quoted', "caché", "9lives"]
    lines = [f'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",'
             f'source="{name}"}} 10' for name in odd]  # fmt: skip
    text = exposition(
        "# TYPE vllm:prefix_cache_queries_total counter",
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000',
        "# TYPE vllm:prompt_tokens_cached_by_source_total counter",
        'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 400',
        'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} 100',
        *lines,
    )
    scraper, endpoint = scraper_on(lambda: text)
    try:
        assert scraper.scrape_endpoint(endpoint.url)
        assert tiers_of(scraper) == {("m", "gpu"): 0.4, ("m", "host"): 0.1}
        assert errors_of(scraper) == {"bad_tier": len(odd)}
        assert all(len(t["tier"]) <= 32 for t in scraper.metrics()["engine_tiers"])
    finally:
        endpoint.close()


def test_tiers_per_model_are_bounded() -> None:
    names = [f"tier{i:02d}" for i in range(20)]
    text = exposition(
        "# TYPE vllm:prefix_cache_queries_total counter",
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000',
        "# TYPE vllm:prompt_tokens_cached_by_source_total counter",
        'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 40',
        *(f'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",'
          f'source="{name}"}} 10' for name in names),
    )  # fmt: skip
    scraper, endpoint = scraper_on(lambda: text)
    try:
        assert scraper.scrape_endpoint(endpoint.url)
        tiers = {tier for _model, tier in tiers_of(scraper)}
        assert len(tiers) == MAX_TIERS_PER_MODEL and "gpu" in tiers
        assert errors_of(scraper) == {"too_many_tiers": 1}
    finally:
        endpoint.close()


def test_a_stale_engines_tiers_are_withdrawn_and_vanished_models_pruned() -> None:
    sglang = Sglang0523()
    sglang.finish(1000, device=300, host=200)
    state = {"up": True, "model": "qwen"}

    def text() -> str:
        if not state["up"]:
            raise RuntimeError("the engine's exporter broke")  # the handler answers 500
        return sglang.text().replace('model_name="qwen"', f'model_name="{state["model"]}"')

    scraper, endpoint = scraper_on(text)
    try:
        assert scraper.scrape_endpoint(endpoint.url)
        state["up"] = False
        for _ in range(STALE_AFTER_FAILURES - 1):
            assert not scraper.scrape_endpoint(endpoint.url)
        assert set(tiers_of(scraper)) == {("qwen", "gpu"), ("qwen", "host")}
        assert not scraper.scrape_endpoint(endpoint.url)
        assert tiers_of(scraper) == {}
        state.update(up=True, model="qwen-2")
        assert scraper.scrape_endpoint(endpoint.url)
        assert {model for model, _tier in tiers_of(scraper)} == {"qwen-2"}
    finally:
        endpoint.close()


def test_an_engine_without_a_split_has_no_tiers() -> None:
    vllm = VllmMetrics()  # an older vLLM: prefix-cache counters only
    vllm.serve("llama", queries=1000, hits=400)
    assert parse_engine_tiers(vllm.text(), "e") == []
    sglang = Sglang0523()
    sglang.finish(1000, device=300, split=False)
    assert parse_engine_tiers(sglang.text(), "e")[0].hits == {}
    # An older SGLang's cached-token counter without the cache_source label (or with it
    # empty, which Prometheus reads as no label): a hit ratio, no tier, nothing refused.
    text = exposition(
        *SGLANG_HEAD, sglang_lines("q", "1000")[0],
        "# TYPE sglang:cached_tokens_total counter",
        'sglang:cached_tokens_total{engine_type="unified",model_name="q"} 250',
        'sglang:cached_tokens_total{cache_source="",engine_type="unified",model_name="q"} 50',
    )  # fmt: skip
    scraper, endpoint = scraper_on(lambda: text)
    try:
        assert scraper.scrape_endpoint(endpoint.url)
        assert scraper.metrics()["engines"][0]["hit_ratio"] == 0.3
        assert tiers_of(scraper) == {} and errors_of(scraper) == {}
    finally:
        endpoint.close()


def serving(engine: Sglang0523, prompt: int, device: int, host: int) -> Callable[[], str]:
    """The engine's text, one request finished before each scrape: every scrape window has
    traffic (an idle engine has no ratio over its window), all at the same shares."""

    def text() -> str:
        engine.finish(prompt, device=device, host=host)
        return engine.text()

    return text


def test_kvcast_run_exports_each_tier_beside_the_engines_ratio(tmp_path: Path) -> None:
    endpoint = Endpoint(serving(Sglang0523(), 2000, device=600, host=400))
    daemon = DaemonProcess(
        ["--engine-metrics", endpoint.url, "--engine-scrape-interval", "0.2",
         "--capacity-blocks", "2275", "--block-size", "16",
         "--metrics-addr", "127.0.0.1:0", "--refresh-interval", "0.3",
         "--sample-conversations", "300"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        lines = [
            f'kvcast_engine_hit_ratio_tier{{engine="{endpoint.url}",model="qwen",tier="gpu"}} 0.3',
            f'kvcast_engine_hit_ratio_tier{{engine="{endpoint.url}",model="qwen",tier="host"}} 0.2',
            f'kvcast_engine_hit_ratio{{engine="{endpoint.url}",model="qwen"}} 0.5',
        ]
        wait_until(
            lambda: all(line in daemon.raw("/metrics").decode() for line in lines),
            30,
            "both tiers and the overall ratio on /metrics",
        )
        text = daemon.raw("/metrics").decode()
        assert "# TYPE kvcast_engine_hit_ratio_tier gauge" in text
    finally:
        daemon.stop()
        endpoint.close()


def test_models_with_tiers_are_bounded_per_endpoint() -> None:
    sglang = [
        line
        for i in range(100)
        for line in sglang_lines(f"m{i:03d}", "1000", device="100", host="50")
    ]
    text = exposition(
        *SGLANG_HEAD, *(line for line in sglang if "prompt" in line),
        *CACHED_HEAD, *(line for line in sglang if "cached" in line),
    )  # fmt: skip
    scraper, endpoint = scraper_on(lambda: text)
    try:
        assert scraper.scrape_endpoint(endpoint.url)
        models = {model for model, _tier in tiers_of(scraper)}
        assert models == {f"m{i:03d}" for i in range(MAX_MODELS_PER_ENGINE)}
        # Counted once for the overall ratios and once for the tiers.
        assert errors_of(scraper) == {"too_many_models": 2}
    finally:
        endpoint.close()


def test_sglangs_multiprocess_exposition_is_read_summed_over_its_processes(
    tmp_path: Path,
) -> None:
    """SGLang serves /metrics in prometheus-client's multiprocess mode (0.5.23
    ``sglang/srt/utils/common.py``: ``set_prometheus_multiproc_dir``,
    ``add_prometheus_middleware``): each process counts into its own file under
    PROMETHEUS_MULTIPROC_DIR and the endpoint sums them, without ``_created`` samples. Two
    tokenizer processes count here, each a real process with that directory set."""
    counting = (
        "import sys; from tests.daemon.test_engine_tiers import Sglang0523; s = Sglang0523(); "
        "s.finish(int(sys.argv[1]), device=int(sys.argv[2]), host=int(sys.argv[3]))"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for prompt, device, host in ((1000, 300, 100), (3000, 100, 500)):
        subprocess.run(
            [sys.executable, "-c", counting, str(prompt), str(device), str(host)],
            env=env, cwd=Path(__file__).resolve().parents[2], check=True, timeout=60,
        )  # fmt: skip
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # one file per process
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    assert "_created" not in text
    (reading,) = parse_engine_tiers(text, "e")
    assert reading.queries == 4000.0 and reading.hits == {"gpu": 400.0, "host": 600.0}
