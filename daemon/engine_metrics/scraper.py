"""The scraper: every endpoint in a thread of its own, its failures counted and logged, its
windows kept; and the capacity lookup at start-up (``engine_capacity``)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcast.daemon.engine_metrics.http_scrape import ScrapeError, scrape
from kvcast.daemon.engine_metrics.readings import (
    CACHE_CONFIG,
    EngineCapacity,
    EngineReading,
    TierReading,
    engine_name,
    invalid,
    invalid_ratios,
    invalid_tiers,
    parse_exposition,
    redacted_url,
)
from kvcast.daemon.engine_metrics.windows import HitRatioWindow, TierWindow

log = logging.getLogger(__name__)

STALE_AFTER_FAILURES = 3  # failed scrapes in a row before an endpoint's ratios are withdrawn
MAX_MODELS_PER_ENGINE = 64  # an endpoint serving more is misbehaving (labels must stay bounded)
LOG_EVERY_S = 60.0  # at most one warning a minute per endpoint while it keeps failing


def _read(
    fetch: Callable[[str, float], str], url: str, deadline_s: float
) -> tuple[list[EngineReading], list[EngineCapacity], list[TierReading]]:
    """One endpoint's readings, capacities and per-tier readings; :class:`ScrapeError` on any
    failure."""
    text = fetch(url, deadline_s)
    try:
        return parse_exposition(text, engine_name(url))
    except Exception as exc:  # the exposition parser raises more than ValueError on garbage
        raise ScrapeError("parse", f"not Prometheus text ({type(exc).__name__}: {exc})") from None


def engine_capacity(
    urls: Sequence[str],
    timeout_s: float = 5.0,
    fetch: Callable[[str, float], str] = scrape,
) -> tuple[int, int, int]:
    """``(capacity_blocks per instance, block_size, instances)`` from the vLLM endpoints
    among ``urls``, all scraped at once within ``timeout_s`` seconds; ValueError naming every
    endpoint that failed (one line), or when none says, or when they disagree."""
    results: dict[str, list[EngineCapacity] | ScrapeError] = {}

    def read(url: str) -> None:
        try:
            results[url] = _read(fetch, url, timeout_s)[1]
        except ScrapeError as exc:
            results[url] = exc
        except Exception as exc:  # never a traceback at start-up
            results[url] = ScrapeError("internal", f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=read, args=(url,), daemon=True) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 1.0)
    found: list[EngineCapacity] = []
    problems: list[str] = []
    for url in urls:
        capacities = results.get(url, ScrapeError("timeout", "no answer within the deadline"))
        if isinstance(capacities, ScrapeError):
            problems.append(f"{redacted_url(url)}: {capacities}")
        elif not capacities:
            problems.append(
                f"{redacted_url(url)}: no {CACHE_CONFIG} with num_gpu_blocks and block_size"
            )
        else:
            found += capacities[:1]  # one per endpoint: its engine ranks share one config
    # An endpoint that failed is an error even when another answered: it would be missing
    # from --instances without a word.
    failed = any(not isinstance(results.get(url), list) for url in urls)
    if failed or not found:
        raise ValueError(
            "--engine-metrics: capacity and block size could not be read ("
            + "; ".join(problems)
            + "); fix the endpoint, or give --capacity-blocks and --block-size to start"
            " without it (it is then scraped again every --engine-scrape-interval)"
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
class _Endpoint:
    """What the scraper knows of one endpoint (guarded by the scraper's lock)."""

    url: str
    name: str
    state: str = "not scraped yet"
    failures: int = 0  # failed scrapes in a row
    scrapes: int = 0  # good scrapes
    errors: dict[str, int] = field(default_factory=dict)  # reason -> count
    windows: dict[str, HitRatioWindow] = field(default_factory=dict)  # model -> counts
    gauges: dict[str, float] = field(default_factory=dict)  # model -> the engine's ratio
    tiers: dict[str, TierWindow] = field(default_factory=dict)  # model -> counts per tier
    logged_at: float = -math.inf

    def count(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1


class EngineScraper:
    """Scrapes each URL every ``interval_s`` seconds, each endpoint in a thread of its own
    with ``timeout_s`` seconds for a whole scrape; :meth:`metrics` gives ``{"engines":
    [{"engine", "model", "hit_ratio"}], "engine_tiers": [{"engine", "model", "tier",
    "hit_ratio"}], "engine_states": {url: state}, "engine_scrape_errors": [{"engine", "reason",
    "count"}]}`` for the metrics view."""

    def __init__(
        self,
        urls: Sequence[str],
        interval_s: float = 15.0,
        window_s: float = 300.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        fetch: Callable[[str, float], str] = scrape,
    ) -> None:
        self.urls = tuple(dict.fromkeys(urls))  # one thread per distinct URL
        self.interval_s, self.window_s, self.timeout_s = interval_s, window_s, timeout_s
        self._clock, self._fetch = clock, fetch
        self._lock = threading.Lock()
        self._endpoints = {url: _Endpoint(url, engine_name(url)) for url in self.urls}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def scrape_once(self) -> None:
        """One scrape of every endpoint, one after the other (tests; the threads of
        :meth:`start` scrape each on its own)."""
        for url in self.urls:
            self.scrape_endpoint(url)

    def scrape_endpoint(self, url: str) -> bool:
        """One scrape of ``url``; True when it gave a reading. Never raises."""
        try:
            readings, _capacities, tier_readings = _read(self._fetch, url, self.timeout_s)
        except ScrapeError as exc:
            self._failed(url, exc.reason, str(exc))
            return False
        except Exception as exc:  # a bug of ours must not end the endpoint's thread
            self._failed(url, "internal", f"{type(exc).__name__}: {exc}")
            return False
        now = self._clock()
        rejected: list[str] = []
        with self._lock:
            endpoint = self._endpoints[url]
            if len(readings) > MAX_MODELS_PER_ENGINE:
                endpoint.errors["too_many_models"] = endpoint.errors.get("too_many_models", 0) + 1
                rejected.append(f"{len(readings)} models, keeping {MAX_MODELS_PER_ENGINE}")
                readings = sorted(readings, key=lambda r: r.model)[:MAX_MODELS_PER_ENGINE]
            seen: set[str] = set()
            for reading in readings:
                problem = invalid(reading)
                if problem is not None:
                    endpoint.errors["bad_value"] = endpoint.errors.get("bad_value", 0) + 1
                    rejected.append(f"model {reading.model!r}: {problem}")
                    continue
                seen.add(reading.model)
                if reading.ratio is not None:
                    endpoint.gauges[reading.model] = reading.ratio
                    endpoint.windows.pop(reading.model, None)
                else:
                    window = endpoint.windows.setdefault(
                        reading.model, HitRatioWindow(self.window_s)
                    )
                    window.add(now, reading.hits, reading.queries)  # type: ignore[arg-type]
                    endpoint.gauges.pop(reading.model, None)
                    ratio = window.ratio()
                    if ratio is not None and not 0.0 <= ratio <= 1.0:
                        # Hits that grew faster than the queries between two valid scrapes:
                        # counted, and the window starts anew at this (valid) scrape.
                        endpoint.count("bad_value")
                        rejected.append(f"model {reading.model!r}: ratio {ratio:g} over the window")
                        window.samples.clear()
                        window.add(now, reading.hits, reading.queries)  # type: ignore[arg-type]
            for models in (endpoint.windows, endpoint.gauges):  # models no longer served
                for model in [m for m in models if m not in seen]:
                    del models[model]
            rejected += self._add_tiers(endpoint, now, tier_readings)
            endpoint.failures = 0
            endpoint.scrapes += 1
            previous = endpoint.state
            endpoint.state = (
                "ok" if readings or tier_readings else "ok (no prefix-cache metrics yet)"
            )
            state = endpoint.state
        if previous != state and previous != "not scraped yet":
            log.info("engine metrics %s: %s", endpoint.name, state)
        if rejected:
            self._log(url, "rejected values: " + "; ".join(rejected[:3]))
        return True

    def _add_tiers(self, endpoint: _Endpoint, now: float, readings: list[TierReading]) -> list[str]:
        """Add one scrape's per-tier readings to ``endpoint`` (its lock held); what was
        rejected, for the log."""
        rejected: list[str] = []
        if len(readings) > MAX_MODELS_PER_ENGINE:
            endpoint.count("too_many_models")
            rejected.append(f"{len(readings)} models with tiers, keeping {MAX_MODELS_PER_ENGINE}")
            readings = sorted(readings, key=lambda r: r.model)[:MAX_MODELS_PER_ENGINE]
        seen: set[str] = set()
        for reading in readings:
            for reason, what in reading.problems:
                endpoint.count(reason)
                rejected.append(f"model {reading.model!r}: {what}")
            problem = invalid_tiers(reading)
            if problem is not None:
                endpoint.count("bad_value")
                rejected.append(f"model {reading.model!r}: {problem}")
                continue
            seen.add(reading.model)
            window = endpoint.tiers.setdefault(reading.model, TierWindow(self.window_s))
            window.add(now, reading.queries, reading.hits)
            problem = invalid_ratios(window.ratios())
            if problem is not None:  # counts that grew faster than the input: start anew
                endpoint.count("bad_value")
                rejected.append(f"model {reading.model!r}: {problem} over the window")
                window.samples.clear()
                window.add(now, reading.queries, reading.hits)  # valid on its own (above)
        for model in [m for m in endpoint.tiers if m not in seen]:
            del endpoint.tiers[model]
        return rejected

    def _failed(self, url: str, reason: str, message: str) -> None:
        with self._lock:
            endpoint = self._endpoints[url]
            endpoint.failures += 1
            endpoint.errors[reason] = endpoint.errors.get(reason, 0) + 1
            stale = endpoint.failures >= STALE_AFTER_FAILURES
            if stale:  # its last ratio would be exported forever
                endpoint.windows.clear()
                endpoint.gauges.clear()
                endpoint.tiers.clear()
            endpoint.state = f"unavailable: {message} ({endpoint.failures} failed in a row)"
            if stale:
                endpoint.state += "; its ratios are withdrawn"
        self._log(url, f"{reason}: {message}")

    def _log(self, url: str, message: str) -> None:
        """A warning, at most once per ``LOG_EVERY_S`` per endpoint."""
        now = time.monotonic()
        with self._lock:
            endpoint = self._endpoints[url]
            if now - endpoint.logged_at < LOG_EVERY_S:
                return
            endpoint.logged_at = now
        log.warning("engine metrics %s: %s", endpoint.name, message)

    def metrics(self) -> dict[str, Any]:
        """The metrics view's ``engines`` (hit ratio per engine and model), ``engine_tiers``
        (per engine, model and tier), their states and the scrape errors by endpoint and
        reason."""
        with self._lock:
            engines, tiers, errors = [], [], []
            for endpoint in self._endpoints.values():
                ratios = {model: w.ratio() for model, w in endpoint.windows.items()}
                ratios.update(endpoint.gauges)
                engines += [
                    {"engine": endpoint.name, "model": model, "hit_ratio": ratio}
                    for model, ratio in sorted(ratios.items())
                    if ratio is not None and math.isfinite(ratio) and 0.0 <= ratio <= 1.0
                ]
                for model, window in sorted(endpoint.tiers.items()):
                    ratios = window.ratios()
                    if invalid_ratios(ratios) is None:
                        tiers += [
                            {"engine": endpoint.name, "model": model, "tier": tier,
                             "hit_ratio": ratio}
                            for tier, ratio in sorted(ratios.items())
                        ]  # fmt: skip
                errors += [
                    {"engine": endpoint.name, "reason": reason, "count": count}
                    for reason, count in sorted(endpoint.errors.items())
                ]
            states = {url: endpoint.state for url, endpoint in self._endpoints.items()}
        return {
            "engines": engines,
            "engine_tiers": tiers,
            "engine_states": states,
            "engine_scrape_errors": errors,
        }

    def start(self) -> EngineScraper:
        for number, url in enumerate(self.urls):
            thread = threading.Thread(
                target=self._loop, args=(url,), name=f"kvcast-engine-metrics-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _loop(self, url: str) -> None:
        while not self._stop.is_set():
            self.scrape_endpoint(url)
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 1.0)
