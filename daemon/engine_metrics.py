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
  and ``block_size``;
- the share of input tokens each cache tier served (``kvcast_engine_hit_ratio_tier``), over the
  same window, where the engine says which tier a hit came from (``TIER_SOURCES`` below names
  the counters and the engine files and versions they were read from; docs/tiers_observed.md).

The ``engine`` label of ``kvcast_engine_hit_ratio`` is the endpoint's URL (without credentials
or query); ``model`` is the engine's ``model_name`` label. Standard library and
prometheus-client only.

Each endpoint is scraped by a thread of its own, with a deadline for the whole scrape (connect,
headers, body), so an endpoint that hangs, drips or answers garbage delays no other. Every
failure is caught, counted (``kvcast_engine_scrape_errors_total{engine,reason}``) and logged at
most once a minute per endpoint; after ``STALE_AFTER_FAILURES`` failed scrapes in a row the
endpoint's ratios are withdrawn. A ratio that is not finite or outside [0, 1] is rejected
(reason ``bad_value``), never exported; a model an endpoint no longer reports is dropped at its
next good scrape; at most ``MAX_MODELS_PER_ENGINE`` models are kept per endpoint. A tier label
that is not a short lower-case name is rejected (reason ``bad_tier``), at most
``MAX_TIERS_PER_MODEL`` tiers are kept per model (reason ``too_many_tiers``).
"""

from __future__ import annotations

import base64
import http.client
import io
import logging
import math
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "EngineCapacity",
    "EngineReading",
    "EngineScraper",
    "HitRatioWindow",
    "ScrapeError",
    "TierReading",
    "TierWindow",
    "engine_capacity",
    "parse_engine_metrics",
    "parse_engine_tiers",
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
STALE_AFTER_FAILURES = 3  # failed scrapes in a row before an endpoint's ratios are withdrawn
MAX_MODELS_PER_ENGINE = 64  # an endpoint serving more is misbehaving (labels must stay bounded)
LOG_EVERY_S = 60.0  # at most one warning a minute per endpoint while it keeps failing


@dataclass(frozen=True)
class TierSource:
    """One engine's per-tier counters: tokens served from each tier (``hits``, split by the
    label ``tier_label``) over the input tokens (``queries``), both cumulative and summed per
    model over the engine's other labels (ranks, workers)."""

    engine: str  # the family, for messages and docs
    hits: str  # counter family (as the parser names it, without _total)
    tier_label: str | None  # None: one family per tier, in ``tier_families``
    queries: str
    model_labels: tuple[str, ...] = ("model_name",)  # the first non-empty one names the model
    tier_families: tuple[tuple[str, str], ...] = ()  # (family, tier) when tier_label is None


# Where each engine says which tier served a cached token; the first source an exposition has
# for a model wins (so an engine's own split is preferred to a connector's). Read from:
# - vLLM 0.33.0 ``vllm/v1/metrics/loggers.py``: ``vllm:prompt_tokens_cached_by_source``
#   {model_name, engine, source} ("Prefix-cache hit tokens by the cache tier that supplied
#   them ... sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits"), sources from
#   ``vllm/v1/metrics/cache_hit_source.py`` (device, host, p2p, disk, external_unspecified; the
#   KV offloading connector's CPU manager answers host, ``vllm/v1/kv_offload/cpu/manager.py``),
#   over ``vllm:prefix_cache_queries`` (the queried tokens of the same admissions);
# - SGLang 0.5.23 ``sglang/srt/observability/metrics_collector.py``: ``sglang:cached_tokens``
#   {model_name, engine_type, cache_source} (device, host, storage with HiCache's L3; ``total``
#   when a request has no split), over ``sglang:prompt_tokens`` {..., is_streaming};
# - LMCache 0.5.6 ``lmcache/observability.py``: ``lmcache:num_hit_tokens`` (tokens retrieved
#   from LMCache) and ``lmcache:num_vllm_hit_tokens`` (found in vLLM's own cache) over
#   ``lmcache:num_prompt_tokens``, labelled {model_name, worker_id, role, served_model_name};
#   ``lmcache:num_requested_tokens`` is only the part asked of LMCache, not the input.
TIER_SOURCES = (
    TierSource("vllm", "vllm:prompt_tokens_cached_by_source", "source",
               "vllm:prefix_cache_queries"),
    TierSource("sglang", "sglang:cached_tokens", "cache_source", "sglang:prompt_tokens"),
    TierSource("lmcache", "", None, "lmcache:num_prompt_tokens",
               model_labels=("served_model_name", "model_name"),
               tier_families=(("lmcache:num_vllm_hit_tokens", "gpu"),
                              ("lmcache:num_hit_tokens", "lmcache"))),
)  # fmt: skip
# The engines' words for the accelerator's own cache (and vLLM's unattributed connector hits)
# in kvcast's: the forecast's first tier is "gpu". Other tiers keep the engine's name.
TIER_ALIASES = {"device": "gpu", "external_unspecified": "external"}
# Hits of no one tier: SGLang's label for a request without a split, and no label at all (an
# older engine's counter without the tier label; in Prometheus an empty value is no label).
NOT_TIERS = frozenset({"total", ""})
TIER_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")  # what may become a label value
MAX_TIERS_PER_MODEL = 8  # vLLM names five, SGLang three: more is misbehaving


@dataclass(frozen=True)
class EngineReading:
    """One model on one endpoint at one scrape: cumulative counts (tokens or blocks, as the
    engine counts them) or, without counters, the engine's own ratio (0-1)."""

    engine: str  # the endpoint's URL, without credentials or query
    model: str
    hits: float | None = None
    queries: float | None = None
    ratio: float | None = None


@dataclass(frozen=True)
class TierReading:
    """One model's per-tier counts on one endpoint at one scrape: cumulative input tokens
    (``queries``) and tokens served from each tier (``hits``, kvcast's tier names).
    ``problems`` are the tier labels refused (reason, what)."""

    engine: str
    model: str
    source: str  # which engine's counters (TIER_SOURCES)
    queries: float
    hits: Mapping[str, float]
    problems: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EngineCapacity:
    """What ``vllm:cache_config_info`` says: blocks per instance, tokens per block."""

    engine: str
    num_gpu_blocks: int
    block_size: int


def redacted_url(url: str) -> str:
    """``url`` without credentials, query or fragment: what names an endpoint in labels and
    logs (a token in a query string stays out of both)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # a port that is not a number: keep what was written
        port = ":" + parts.netloc.rpartition(":")[2]
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else url


def engine_name(url: str) -> str:
    """The ``engine`` label: the endpoint's URL (two paths on one host:port are two engines)."""
    return redacted_url(url)


def parse_engine_metrics(
    text: str, engine: str
) -> tuple[list[EngineReading], list[EngineCapacity]]:
    """The readings and capacities in one exposition (``text``); ValueError when it is not
    Prometheus text."""
    readings, capacities, _tiers = _parse(text, engine)
    return readings, capacities


def parse_engine_tiers(text: str, engine: str) -> list[TierReading]:
    """The per-tier readings in one exposition, one per model; ValueError when it is not
    Prometheus text."""
    return _parse(text, engine)[2]


_TIER_FAMILIES = {
    name: source
    for source in TIER_SOURCES
    for name in (source.hits, source.queries, *(f for f, _tier in source.tier_families))
    if name
}


def _parse(
    text: str, engine: str
) -> tuple[list[EngineReading], list[EngineCapacity], list[TierReading]]:
    values: dict[tuple[str, str], float] = {}
    gauges: dict[tuple[str, str], float] = {}
    capacities: list[EngineCapacity] = []
    # (family, model, tier label or "") -> cumulative count, summed over the other labels
    tier_counts: dict[tuple[str, str, str], float] = {}
    counter_names = {name for pair in COUNTER_PAIRS for name in pair}
    for family in text_string_to_metric_families(text):
        tier_source = _TIER_FAMILIES.get(family.name.removesuffix("_total"))
        if tier_source is not None:
            _count_tiers(family, tier_source, tier_counts)
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
        if model not in readings:  # checked by the scraper (a ratio out of range is counted)
            readings[model] = EngineReading(engine, model, ratio=ratio)
    return list(readings.values()), capacities, _tier_readings(engine, tier_counts)


def _count_tiers(
    family: Any, source: TierSource, counts: dict[tuple[str, str, str], float]
) -> None:
    """Add one family's ``_total`` samples to ``counts`` by (family, model, tier label)."""
    name = family.name.removesuffix("_total")
    tier_label = source.tier_label if name == source.hits else None
    for sample in family.samples:
        if not sample.name.endswith("_total"):  # _created, or a gauge of the same name
            continue
        labels = sample.labels
        model = next((labels[k] for k in source.model_labels if labels.get(k)), "")
        tier = labels.get(tier_label, "") if tier_label else ""
        key = (name, model, tier)
        counts[key] = counts.get(key, 0.0) + sample.value


def _tier_name(label: str) -> tuple[str | None, str | None]:
    """(kvcast's name for an engine's tier label, None) or (None, why it is refused); (None,
    None) for a label that names no tier."""
    if label in NOT_TIERS:
        return None, None
    tier = TIER_ALIASES.get(label, label)
    if not TIER_NAME.fullmatch(tier):
        return None, f"tier label {label[:40]!r}"
    return tier, None


def _tier_readings(engine: str, counts: dict[tuple[str, str, str], float]) -> list[TierReading]:
    """One reading per model, from the first of TIER_SOURCES with its hits and queries."""
    # (family, model) -> [(tier label, count)]: one pass, however many series an endpoint has
    by_model: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for (name, model, label), value in counts.items():
        by_model.setdefault((name, model), []).append((label, value))
    readings: dict[str, TierReading] = {}
    for source in TIER_SOURCES:
        families = source.tier_families or ((source.hits, ""),)
        models = {model for name, model in by_model for family, _tier in families if name == family}
        for model in sorted(models - set(readings)):
            queries = counts.get((source.queries, model, ""))
            if queries is None:
                continue
            hits: dict[str, float] = {}
            problems: list[tuple[str, str]] = []
            for family, fixed in families:
                for label, value in by_model.get((family, model), ()):
                    tier, problem = (fixed, None) if fixed else _tier_name(label)
                    if problem is not None:
                        problems.append(("bad_tier", problem))
                    elif tier is not None:
                        hits[tier] = hits.get(tier, 0.0) + value
            if source.engine == "lmcache" and "lmcache" in hits and "gpu" in hits:
                # LMCache retrieves from the last chunk boundary below vLLM's own hit, so up to
                # a chunk per request is counted by both: LMCache serves at most what vLLM lacks.
                # min() of two non-decreasing counts never decreases, as a counter must not.
                hits["lmcache"] = min(hits["lmcache"], max(queries - hits["gpu"], 0.0))
            # The accelerator's tier always; others once they have served a token (vLLM
            # declares all five sources at 0 whether or not a connector has them).
            shown = {t: v for t, v in hits.items() if t == "gpu" or v != 0.0}
            if len(shown) > MAX_TIERS_PER_MODEL:
                order = sorted(shown, key=lambda t: (t != "gpu", t))
                problems.append(
                    ("too_many_tiers", f"{len(shown)} tiers, keeping {MAX_TIERS_PER_MODEL}")
                )
                shown = {t: shown[t] for t in order[:MAX_TIERS_PER_MODEL]}
            readings[model] = TierReading(
                engine, model, source.engine, queries, shown, tuple(problems)
            )
    return list(readings.values())


def _capacity(engine: str, labels: dict[str, str]) -> EngineCapacity | None:
    try:
        blocks, block_size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None  # before the engine has profiled its memory, num_gpu_blocks is "None"
    if blocks < 1 or block_size < 1:
        return None
    return EngineCapacity(engine, blocks, block_size)


class ScrapeError(Exception):
    """One scrape failed; ``reason`` is the label of ``kvcast_engine_scrape_errors_total``."""

    def __init__(self, reason: str, message: str) -> None:
        # A peer's bytes end up in the message: one line, printable, bounded (logs, errors).
        line = " ".join("".join(c if c.isprintable() else " " for c in message).split())
        super().__init__(line if len(line) <= 200 else line[:197] + "...")
        self.reason = reason


class _DeadlineSocket:
    """The connected socket, its reads each allowed only what is left of one deadline
    (monotonic seconds), so a peer that drips one byte at a time cannot stretch a scrape past
    it. http.client reads the reply through :meth:`makefile` and may close the connection
    before the body is read: the socket closes when both are done with it, as a plain
    socket's ``makefile`` does."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline
        self._users = 1  # this wrapper; each reader adds one

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._users += 1
        return io.BufferedReader(_DeadlineReader(self))

    def recv_into(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the scrape's deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            self._sock.close()

    def close(self) -> None:
        self.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self._socket = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._socket.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._socket.release()
        super().close()


def _connection(url: str, deadline: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    left = max(deadline - time.monotonic(), 0.001)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    host = parts.hostname or ""
    connection = kind(host, parts.port, timeout=left)
    connection.connect()
    connection.sock = _DeadlineSocket(connection.sock, deadline)  # type: ignore[assignment]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return connection, target


def scrape(url: str, deadline_s: float) -> str:
    """The endpoint's exposition text, within ``deadline_s`` seconds in all (connect, headers
    and body together); :class:`ScrapeError` with a reason on any failure."""
    deadline = time.monotonic() + deadline_s
    connection = None
    try:
        connection, target = _connection(url, deadline)
        headers = {"Accept": "text/plain", "User-Agent": "kvcast"}
        parts = urlsplit(url)
        if parts.username is not None:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            raise ScrapeError("status", f"HTTP {response.status} {response.reason}")
        body = response.read(MAX_BODY_BYTES + 1)
    except ScrapeError:
        raise
    except TimeoutError as exc:  # socket.timeout is TimeoutError since Python 3.10
        raise ScrapeError("timeout", f"no whole reply within {deadline_s:g} s ({exc})") from None
    except http.client.HTTPException as exc:  # not HTTP, > 100 headers, a bad chunk, cut short
        message = f"not a valid HTTP reply ({type(exc).__name__}: {exc})"
        raise ScrapeError("protocol", message) from None
    except ValueError as exc:  # a chunk size that is not hex; a bad port in the URL
        raise ScrapeError("protocol", f"not a valid HTTP reply (ValueError: {exc})") from None
    except OSError as exc:
        raise ScrapeError("connect", f"{type(exc).__name__}: {exc}") from None
    finally:
        if connection is not None:
            connection.close()
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError("too_large", f"more than {MAX_BODY_BYTES} bytes of metrics")
    return body.decode("utf-8", errors="replace")


def _read(
    fetch: Callable[[str, float], str], url: str, deadline_s: float
) -> tuple[list[EngineReading], list[EngineCapacity], list[TierReading]]:
    """One endpoint's readings, capacities and per-tier readings; :class:`ScrapeError` on any
    failure."""
    text = fetch(url, deadline_s)
    try:
        return _parse(text, engine_name(url))
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


@dataclass
class TierWindow:
    """Cumulative (input tokens, tokens per tier) of one model on one engine over the scrapes
    of the last ``window_s`` seconds. A tier absent from a sample has served nothing yet (SGLang
    creates a tier's series at its first hit); a count that went down (an engine restart, a tier
    gone) starts the window anew."""

    window_s: float
    samples: deque[tuple[float, float, dict[str, float]]] = field(default_factory=deque)

    def add(self, at_s: float, queries: float, hits: Mapping[str, float]) -> None:
        if self.samples:
            _at, last_queries, last_hits = self.samples[-1]
            if queries < last_queries or any(
                hits.get(tier, 0.0) < count for tier, count in last_hits.items()
            ):
                self.samples.clear()
        self.samples.append((at_s, queries, dict(hits)))
        while len(self.samples) > 2 and at_s - self.samples[1][0] >= self.window_s:
            self.samples.popleft()

    def ratios(self) -> dict[str, float]:
        """Each tier's tokens per input token over the window (since the engine started with
        one scrape); empty without input tokens."""
        if not self.samples:
            return {}
        _at, queries, hits = self.samples[-1]
        first_queries, first_hits = 0.0, {}
        if len(self.samples) > 1:
            _first_at, first_queries, first_hits = self.samples[0]
        served = queries - first_queries
        if served <= 0:
            return {}
        return {tier: (n - first_hits.get(tier, 0.0)) / served for tier, n in hits.items()}


def invalid_ratios(ratios: Mapping[str, float]) -> str | None:
    """Why per-tier ratios cannot be shares of the input (None when they can)."""
    if not all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in ratios.values()):
        return "tier ratios " + ", ".join(f"{t}={r!r}" for t, r in sorted(ratios.items()))
    total = sum(ratios.values())
    if total > 1.0 + 1e-9:
        return f"tiers serve {total:g} of the input together"
    return None


def invalid_tiers(reading: TierReading) -> str | None:
    """Why a per-tier reading cannot be counts of input tokens (None when it can): not
    finite, negative, or more tokens served than asked for."""
    counts = [reading.queries, *reading.hits.values()]
    if not all(math.isfinite(c) and c >= 0 for c in counts):
        served = ", ".join(f"{t}={n!r}" for t, n in sorted(reading.hits.items()))
        return f"tier counts queries={reading.queries!r} {served}"
    served_total = sum(reading.hits.values())
    if served_total > reading.queries:
        return f"more tokens from the tiers ({served_total:g}) than asked ({reading.queries:g})"
    return None


def invalid(reading: EngineReading) -> str | None:
    """Why a reading cannot be a hit ratio (None when it can): not finite, negative, more
    hits than queries, or a ratio outside [0, 1]."""
    if reading.ratio is not None:
        ratio = reading.ratio
        return None if math.isfinite(ratio) and 0.0 <= ratio <= 1.0 else f"ratio {ratio!r}"
    hits, queries = reading.hits, reading.queries
    if hits is None or queries is None:
        return "no counts"
    if not (math.isfinite(hits) and math.isfinite(queries)) or hits < 0 or queries < 0:
        return f"counts hits={hits!r} queries={queries!r}"
    if hits > queries:
        return f"more hits ({hits:g}) than queries ({queries:g})"
    return None


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
