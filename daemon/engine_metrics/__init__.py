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
  same window, where the engine says which tier a hit came from (``readings.TIER_SOURCES`` names
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

from kvcast.daemon.engine_metrics.http_scrape import ScrapeError, scrape
from kvcast.daemon.engine_metrics.readings import (
    EngineCapacity,
    EngineReading,
    TierReading,
    parse_engine_metrics,
    parse_engine_tiers,
)
from kvcast.daemon.engine_metrics.scraper import EngineScraper, engine_capacity
from kvcast.daemon.engine_metrics.windows import HitRatioWindow, TierWindow

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
