"""The engines' own numbers: their Prometheus endpoints scraped (``--engine-metrics``).

What is read, by the names the engines export (vLLM 0.33 ``vllm/v1/metrics/loggers.py``,
SGLang 0.5 ``sglang/srt/observability/metrics_collector.py``):

- the observed prefix-cache hit ratio per model, from counters where the engine has them, as
  the increase of hits over the increase of queries across the scrapes of the last
  ``window_s`` (since the engine started, until two scrapes exist): vLLM
  ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (older vLLM:
  ``vllm:gpu_prefix_cache_hits_total`` / ``..._queries_total``), SGLang
  ``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total``; else SGLang's gauge
  ``sglang:cache_hit_rate`` as it is. Counts are summed over an endpoint's engine ranks;
- capacity and block size from vLLM's ``vllm:cache_config_info`` labels ``num_gpu_blocks``
  and ``block_size``.

The ``engine`` label of ``kvcast_engine_hit_ratio`` is the endpoint's ``host:port``; ``model``
is the engine's ``model_name`` label. Standard library and prometheus-client only.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "EngineCapacity",
    "EngineReading",
    "EngineScraper",
    "HitRatioWindow",
    "engine_capacity",
    "parse_engine_metrics",
    "scrape",
]

log = logging.getLogger(__name__)

# (hits counter, queries counter) per engine family, newest names first; families as the
# parser names counters (without _total).
COUNTER_PAIRS = (
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"),
    ("sglang:cached_tokens", "sglang:prompt_tokens"),
)
GAUGE_RATIOS = ("sglang:cache_hit_rate",)
CACHE_CONFIG = "vllm:cache_config_info"
MAX_BODY_BYTES = 8 << 20  # an engine's /metrics is well under this


@dataclass(frozen=True)
class EngineReading:
    """One model on one endpoint at one scrape: cumulative counts (tokens or blocks, as the
    engine counts them) or, without counters, the engine's own ratio (0-1)."""

    engine: str  # host:port
    model: str
    hits: float | None = None
    queries: float | None = None
    ratio: float | None = None


@dataclass(frozen=True)
class EngineCapacity:
    """What ``vllm:cache_config_info`` says: blocks per instance, tokens per block."""

    engine: str
    num_gpu_blocks: int
    block_size: int


def engine_name(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


def parse_engine_metrics(
    text: str, engine: str
) -> tuple[list[EngineReading], list[EngineCapacity]]:
    """The readings and capacities in one exposition (``text``); ValueError when it is not
    Prometheus text."""
    values: dict[tuple[str, str], float] = {}
    gauges: dict[tuple[str, str], float] = {}
    capacities: list[EngineCapacity] = []
    counter_names = {name for pair in COUNTER_PAIRS for name in pair}
    for family in text_string_to_metric_families(text):
        if family.name in counter_names:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = (family.name, sample.labels.get("model_name", ""))
                    values[key] = values.get(key, 0.0) + sample.value
        elif family.name in GAUGE_RATIOS:
            for sample in family.samples:
                gauges[(family.name, sample.labels.get("model_name", ""))] = sample.value
        elif family.name == CACHE_CONFIG:
            for sample in family.samples:
                capacity = _capacity(engine, sample.labels)
                if capacity is not None:
                    capacities.append(capacity)
    readings: dict[str, EngineReading] = {}
    for hits_name, queries_name in COUNTER_PAIRS:
        for (name, model), hits in values.items():
            if name != hits_name or model in readings:
                continue
            queries = values.get((queries_name, model))
            if queries is not None:
                readings[model] = EngineReading(engine, model, hits=hits, queries=queries)
    for (_name, model), ratio in gauges.items():
        if model not in readings and 0.0 <= ratio <= 1.0:
            readings[model] = EngineReading(engine, model, ratio=ratio)
    return list(readings.values()), capacities


def _capacity(engine: str, labels: dict[str, str]) -> EngineCapacity | None:
    try:
        blocks, block_size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None  # before the engine has profiled its memory, num_gpu_blocks is "None"
    if blocks < 1 or block_size < 1:
        return None
    return EngineCapacity(engine, blocks, block_size)


def scrape(url: str, timeout_s: float) -> str:
    """The endpoint's exposition text; OSError (URLError, timeouts) or ValueError on failure."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body = response.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"{url}: more than {MAX_BODY_BYTES} bytes of metrics")
    return body.decode("utf-8", errors="replace")


def engine_capacity(urls: Sequence[str], timeout_s: float = 5.0) -> tuple[int, int, int]:
    """``(capacity_blocks per instance, block_size, instances)`` from the vLLM endpoints
    among ``urls``; ValueError naming the endpoint when none says, or they disagree."""
    found: list[EngineCapacity] = []
    problems: list[str] = []
    for url in urls:
        try:
            _readings, capacities = parse_engine_metrics(scrape(url, timeout_s), engine_name(url))
        except (OSError, ValueError) as exc:
            problems.append(f"{url}: {exc}")
            continue
        if not capacities:
            problems.append(f"{url}: no {CACHE_CONFIG} with num_gpu_blocks and block_size")
        found += capacities[:1]  # one per endpoint: its engine ranks share one config
    if not found:
        raise ValueError(
            "--engine-metrics: capacity and block size could not be read ("
            + "; ".join(problems)
            + "); give --capacity-blocks and --block-size"
        )
    sizes = {c.block_size for c in found}
    if len(sizes) > 1:
        raise ValueError(f"--engine-metrics: the engines' block sizes differ: {sorted(sizes)}")
    blocks = min(c.num_gpu_blocks for c in found)
    if max(c.num_gpu_blocks for c in found) != blocks:
        log.warning(
            "engines report different capacities (%s blocks): forecasting the smallest, %d",
            sorted({c.num_gpu_blocks for c in found}),
            blocks,
        )
    return blocks, sizes.pop(), len(found)


@dataclass
class HitRatioWindow:
    """Cumulative (hits, queries) of one model on one engine over the scrapes of the last
    ``window_s`` seconds; a counter that went down (an engine restart) starts it anew."""

    window_s: float
    samples: deque[tuple[float, float, float]] = field(default_factory=deque)

    def add(self, at_s: float, hits: float, queries: float) -> None:
        if self.samples and (hits < self.samples[-1][1] or queries < self.samples[-1][2]):
            self.samples.clear()
        self.samples.append((at_s, hits, queries))
        while len(self.samples) > 2 and at_s - self.samples[1][0] >= self.window_s:
            self.samples.popleft()

    def ratio(self) -> float | None:
        """Hits per query over the window; since the engine started with one scrape; None
        without queries."""
        if not self.samples:
            return None
        _at, hits, queries = self.samples[-1]
        if len(self.samples) > 1:
            _first_at, first_hits, first_queries = self.samples[0]
            hits, queries = hits - first_hits, queries - first_queries
        return hits / queries if queries > 0 else None


class EngineScraper:
    """Scrapes each URL every ``interval_s`` in a thread of its own; :meth:`metrics` gives
    ``{"engines": [{"engine", "model", "hit_ratio"}], ...}`` for the metrics view."""

    def __init__(
        self,
        urls: Sequence[str],
        interval_s: float = 15.0,
        window_s: float = 300.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        fetch: Callable[[str, float], str] = scrape,
    ) -> None:
        self.urls = tuple(urls)
        self.interval_s, self.window_s, self.timeout_s = interval_s, window_s, timeout_s
        self._clock, self._fetch = clock, fetch
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], HitRatioWindow] = {}
        self._gauges: dict[tuple[str, str], float] = {}
        self._state: dict[str, str] = dict.fromkeys(self.urls, "not scraped yet")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> None:
        for url in self.urls:
            engine = engine_name(url)
            try:
                readings, _capacities = parse_engine_metrics(
                    self._fetch(url, self.timeout_s), engine
                )
            except (OSError, ValueError) as exc:
                self._set_state(url, f"unavailable: {exc}")
                continue
            now = self._clock()
            with self._lock:
                for reading in readings:
                    key = (reading.engine, reading.model)
                    if reading.ratio is not None:
                        self._gauges[key] = reading.ratio
                    elif reading.hits is not None and reading.queries is not None:
                        window = self._windows.setdefault(key, HitRatioWindow(self.window_s))
                        window.add(now, reading.hits, reading.queries)
                self._state[url] = "ok" if readings else "ok (no prefix-cache metrics yet)"

    def _set_state(self, url: str, state: str) -> None:
        with self._lock:
            previous, self._state[url] = self._state.get(url), state
        if previous != state:
            log.warning("engine metrics %s: %s", url, state)

    def metrics(self) -> dict[str, Any]:
        """The metrics view's ``engines`` (hit ratio per engine and model) and their states."""
        with self._lock:
            ratios = {key: w.ratio() for key, w in self._windows.items()}
            ratios.update(self._gauges)
            engines = [
                {"engine": engine, "model": model, "hit_ratio": ratio}
                for (engine, model), ratio in sorted(ratios.items())
                if ratio is not None
            ]
            return {"engines": engines, "engine_states": dict(self._state)}

    def start(self) -> EngineScraper:
        self._thread = threading.Thread(
            target=self._loop, name="kvcast-engine-metrics", daemon=True
        )
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1.0)
