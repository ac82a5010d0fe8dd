"""The refresh computation: from the shared window to the forecast and the candidate table.

Pure functions of the store's :class:`~kvcast.daemon.stores.WindowState` and the settings;
the refresher thread (``kvcast.daemon.publisher``) does the reading, publishing and expiry.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores import WindowState
from kvcast.stats.config import StatsConfig
from kvcast.stats.documents import ForecastDocument, TableDocument
from kvcast.stats.forecast import forecast_from_sample, tier_planner
from kvcast.stats.sample import WorkloadSample
from kvcast.stats.snapshot import Snapshot, take_snapshot
from kvcast.stats.table import table_document
from kvcast.stats.tiers import GPU

CURVE_POINTS = 17  # capacities from N/16 to 16N, geometric, N in the middle
PLANS_CACHED = 64  # planner answers kept per refresh (by target and tier)

Planner = Callable[[float, str], dict[str, Any]]
"""``plan(target, tier)``: the ``required_capacity`` document of ``tier`` for the stack's total
hit ratio ``target`` (``kvcast.stats.tiers.plan_tier``); ValueError for a tier not configured."""


def capacity_grid(capacity_blocks: int) -> list[float]:
    """Capacities (blocks) for the published curve: N/16 .. 16N, geometric, N included."""
    half = CURVE_POINTS // 2
    return [capacity_blocks * 2 ** ((i - half) / 2) for i in range(CURVE_POINTS)]


@dataclass(frozen=True)
class Refresh:
    """One refresh's results: the forecast document, the table at ``version`` (not yet
    published), and the snapshot both came from; typed until HTTP or the store serialises
    them (``to_dict()``)."""

    forecast: ForecastDocument
    table: TableDocument
    snapshot: Snapshot
    planner: Planner | None = field(default=None, compare=False)


def make_planner(sample: WorkloadSample, settings: DaemonSettings) -> Planner:
    """The planner over one refresh's sample, the same model as its forecast, solved at the
    first query (not at every refresh); answers cached."""
    plan = tier_planner(
        sample,
        settings.capacity_blocks,
        settings.stats.block_size,
        settings.instances,
        kv_bytes_per_token=settings.kv_bytes_per_token,
        tiers=settings.tiers,
        tier_mode=settings.tier_mode,
    )

    @functools.lru_cache(maxsize=PLANS_CACHED)
    def answer(target: float, tier: str) -> dict[str, Any]:
        return dataclasses.asdict(plan(target, tier))

    return answer


def compute_refresh(state: WindowState, settings: DaemonSettings, table_version: int) -> Refresh:
    """The forecast (with its capacity curve, its tiers and the capacity per target), the
    planner over the same sample, and the table."""
    config = settings.stats
    now = state.newest_event_time if math.isfinite(state.newest_event_time) else None
    # The store cut each partition's buckets at that partition's own age limit.
    snapshot = take_snapshot(state.window, state.arrivals, config, now, age_limited=False)
    common = {
        "capacity_blocks": settings.capacity_blocks,
        "block_size": config.block_size,
        "instances": settings.instances,
        "kv_bytes_per_token": settings.kv_bytes_per_token,
    }
    model = forecast_from_sample(
        snapshot.sample,
        capacities=capacity_grid(settings.capacity_blocks),
        tiers=settings.tiers,
        tier_mode=settings.tier_mode,
        **common,
    )
    # Each target's capacity is forecast_from_sample(..., target=target).required_capacity;
    # one planner solves that model once for all of them instead of once each.
    single_cache = tier_planner(
        snapshot.sample,
        settings.capacity_blocks,
        config.block_size,
        settings.instances,
        kv_bytes_per_token=settings.kv_bytes_per_token,
    )
    forecast = ForecastDocument(
        forecast=model,
        required_capacity_by_target=tuple(
            single_cache(target, GPU) for target in settings.target_hit_ratios
        ),
        event_time=now,
        window_conversations=snapshot.window_conversations,
        computed_at=time.time(),
    )
    # The density policy's horizon is the forecast's T_C: engines rank with the same model.
    table = TableDocument.from_dict(
        table_document(
            snapshot,
            config,
            table_version,
            characteristic_time_s=model.characteristic_time_s,
            instances=settings.instances,
        )
    )
    return Refresh(forecast, table, snapshot, make_planner(snapshot.sample, settings))


def emptied(previous: TableDocument | None, table: TableDocument) -> bool:
    """Whether ``table`` would replace a table with states by one without any: the window
    emptied (event time jumped past every bucket, or the store lost its data)."""
    return previous is not None and bool(previous.states) and not table.states


def should_publish(
    previous: TableDocument | None,
    table: TableDocument,
    since_published_s: float,
    table_interval_s: float,
) -> bool:
    """Publish when the content changed, at most every ``table_interval_s`` seconds.

    Nothing observed yet and nothing published before: engines use the defaults anyway. A
    table with states is never replaced by an empty one (engines keep the last good one).
    """
    warming_up = previous is None and not table.states and table.version == 0
    return (
        not warming_up
        and not emptied(previous, table)
        and table.content_differs(previous)
        and (previous is None or since_published_s >= table_interval_s)
    )


def expiry_bounds(
    state: WindowState, snapshot: Snapshot, config: StatsConfig
) -> tuple[int, int] | None:
    """``(oldest window bucket to keep, oldest arrival second to keep)``, or None when nothing
    may be expired yet (no bucket in the window, no conversation start seen, or a partition
    without an event time to anchor its age limit at).

    The bucket bound holds for every partition's buckets, also those committed after ``state``
    was read (other replicas commit while this one computes): the oldest bucket of the window
    when the window is full (its newer buckets hold ``window_conversations`` already, and
    commits only add to them), else the oldest bucket that any partition's own age limit
    still keeps (each partition's newest event time only grows). Never "the oldest bucket the
    read saw": a partition behind the others (loading, rebalanced, slower) may commit an older
    one, of a conversation the window must count, in between. (Left open: a partition with no
    bucket at the read whose events are more than ``window_max_age_s`` behind every other
    partition's, committing its first buckets in between, loses those below the bound.)
    """
    window = state.window
    chosen = window.buckets_in_window(snapshot.generated_at, age_limited=False)
    if not chosen or not math.isfinite(state.arrivals.newest_start):
        return None
    if sum(bucket.conversations for bucket in chosen) >= config.window_conversations:
        ids = {id(bucket) for bucket in chosen}
        bucket_before = min(index for index, bucket in window.buckets.items() if id(bucket) in ids)
    else:
        anchors = list(state.partition_newest.values())
        if not anchors or not all(math.isfinite(newest_s) for newest_s in anchors):
            return None
        bucket_before = min(_oldest_kept_by_age(newest_s, config) for newest_s in anchors)
    second_before = math.floor(state.arrivals.newest_start) - config.rate_window_s
    return (bucket_before, second_before + 1)


def _oldest_kept_by_age(newest_s: float, config: StatsConfig) -> int:
    """The oldest bucket index that a partition whose newest event time is ``newest_s`` keeps
    within ``window_max_age_s`` (the cut of :func:`~kvcast.stats.window.merge_anchored`)."""
    oldest_allowed = newest_s - config.window_max_age_s
    index = math.floor(oldest_allowed / config.bucket_s)
    # The floor of a quotient may round across a bucket edge: settle it on the cut's own test.
    if (index + 1) * config.bucket_s <= oldest_allowed:  # cut: the next one is kept
        index += 1
    elif index * config.bucket_s > oldest_allowed:  # the one before is kept too
        index -= 1
    return index
