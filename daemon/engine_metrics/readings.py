"""An engine's Prometheus exposition read into hit-ratio, per-tier and capacity readings,
and the checks a reading must pass before it is exported (no I/O: text in, readings out)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

# (hits counter, queries counter) per engine family, newest names first; families as the
# parser names counters (without _total).
COUNTER_PAIRS = (
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"),
    ("sglang:cached_tokens", "sglang:prompt_tokens"),
)
GAUGE_RATIOS = ("sglang:cache_hit_rate",)
CACHE_CONFIG = "vllm:cache_config_info"


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
    readings, capacities, _tiers = parse_exposition(text, engine)
    return readings, capacities


def parse_engine_tiers(text: str, engine: str) -> list[TierReading]:
    """The per-tier readings in one exposition, one per model; ValueError when it is not
    Prometheus text."""
    return parse_exposition(text, engine)[2]


_TIER_FAMILIES = {
    name: source
    for source in TIER_SOURCES
    for name in (source.hits, source.queries, *(f for f, _tier in source.tier_families))
    if name
}


def parse_exposition(
    text: str, engine: str
) -> tuple[list[EngineReading], list[EngineCapacity], list[TierReading]]:
    """Every reading in one exposition: hit ratios, capacities and per-tier counts (one parse
    for all three); ValueError when it is not Prometheus text."""
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
