"""The statistics as Redis records, both ways: a window bucket's hash fields and list batches,
the arrival counters' and event counters' hashes.

Hash field names are JSON arrays (``["r", intent, turn]`` reached, ``["c", ...]`` continued,
``["m", intent, name]`` a moment sum; ``n`` the bucket's conversations); a delay is a JSON row
whose trailing fields are left out while they hold their defaults (``delay_from_row``); shared
block gaps are one flat ``[gap_s, blocks, ...]`` array per batch (``gaps_from_stored`` reads the
earlier ``[[gap_s, blocks], ...]`` too). Shared by every Redis layout.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import orjson

from kvcast.stats.arrivals import ArrivalStats, SecondCounters
from kvcast.stats.engine import EventCounters
from kvcast.stats.window import (
    Bucket,
    DelaySample,
    MomentSums,
    StateSums,
    delay_from_row,
    gaps_from_stored,
)

_MOMENT_FIELDS = ("conversations", "sum_R", "sum_H", "sum_H_hash", "sum_B", "sum_M")
# Written only when not zero (most deployments send no block hashes).
_SHARED_MOMENT_FIELDS = ("sum_S", "sum_S_B", "shared_born")


@functools.lru_cache(maxsize=1 << 14)
def _field(*parts: object) -> bytes:
    """A hash field name of several parts (JSON); the few thousand names in use are cached."""
    return orjson.dumps(parts)


def _delay_row(d: DelaySample) -> list[object]:
    """A delay as stored: the trailing fields left out while they hold their defaults (no
    shared blocks; the state under the conversation's intent), as ``delay_from_row`` reads."""
    if d.state_intent != d.intent:
        return list(d)
    if d.prev_shared:
        return [d.delay_s, d.prev_blocks, d.intent, d.turn, d.prev_shared]
    return [d.delay_s, d.prev_blocks, d.intent, d.turn]


def bucket_sums(bucket: Bucket) -> list[Any]:
    """The bucket's counts and sums as flat (field, amount) pairs for HINCRBY."""
    sums_of_bucket: list[Any] = ["n", bucket.conversations]
    for (intent, turn), sums in bucket.states.items():
        sums_of_bucket += (_field("r", intent, turn), sums.reached)
        if sums.continued:
            sums_of_bucket += (_field("c", intent, turn), sums.continued)
    for intent, moments in bucket.moments.items():
        for name in _MOMENT_FIELDS:
            sums_of_bucket += (_field("m", intent, name), getattr(moments, name))
        for name in _SHARED_MOMENT_FIELDS:
            if getattr(moments, name):
                sums_of_bucket += (_field("m", intent, name), getattr(moments, name))
    return sums_of_bucket


def delays_batch(bucket: Bucket) -> bytes:
    """The bucket's delay samples as one list entry (a JSON array of rows)."""
    return orjson.dumps([_delay_row(d) for d in bucket.delays])


def gaps_batch(bucket: Bucket) -> bytes:
    """The bucket's shared block gaps as one list entry, flat: ``[gap_s, blocks, ...]``."""
    return orjson.dumps(bucket.shared_gaps)


def arrival_sums(arrivals: ArrivalStats) -> dict[str, list[Any]]:
    """The per-second arrival counters as flat (second, amount) pairs for HINCRBY, by hash
    (``starts``, ``cached_tokens``, ``input_tokens``); zero amounts left out."""
    sums: dict[str, list[Any]] = {"starts": [], "cached_tokens": [], "input_tokens": []}
    for second, counters in arrivals.seconds.items():
        for name, pairs in sums.items():
            amount = getattr(counters, name)
            if amount:
                pairs += (second, amount)
    return sums


def counter_sums(counters: EventCounters) -> list[Any]:
    """The event counters as flat (field, amount) pairs for HINCRBY; zero amounts left out."""
    sums: list[Any] = []
    if counters.processed:
        sums += ("processed", counters.processed)
    if counters.duplicates:
        sums += ("duplicates", counters.duplicates)
    for reason, amount in counters.rejected.items():
        if amount:
            sums += (f"rejected:{reason}", amount)
    return sums


def decode_bucket(
    fields: dict[bytes, bytes], delay_batches: list[bytes], gap_batches: list[bytes] = ()
) -> Bucket:
    """A bucket from its hash and its delay and gap batches (``bucket_sums``, ``delays_batch``
    and ``gaps_batch`` added up over every commit)."""
    bucket = Bucket(conversations=int(fields.pop(b"n", 0)))
    for raw_field, raw_value in fields.items():
        kind, intent, name = orjson.loads(raw_field)
        value = int(raw_value)
        if kind == "m":
            setattr(bucket.moments.setdefault(intent, MomentSums()), name, value)
        else:
            sums = bucket.states.setdefault((intent, name), StateSums())
            if kind == "r":
                sums.reached = value
            else:
                sums.continued = value
    for batch in delay_batches:
        bucket.delays.extend(map(delay_from_row, orjson.loads(batch)))
    for batch in gap_batches:
        bucket.shared_gaps.extend(gaps_from_stored(orjson.loads(batch)))
    return bucket


def decode_arrivals(
    rate_window_s: int,
    starts: dict[bytes, bytes],
    cached: dict[bytes, bytes],
    inputs: dict[bytes, bytes],
    meta: dict[bytes, bytes],
) -> ArrivalStats:
    arrivals = ArrivalStats(rate_window_s)
    for source, name in ((starts, "starts"), (cached, "cached_tokens"), (inputs, "input_tokens")):
        for second, value in source.items():
            counters = arrivals.seconds.setdefault(int(second), SecondCounters())
            setattr(counters, name, int(value))
    arrivals.start_count = int(meta.get(b"start_count", 0))
    arrivals.first_start = float(meta.get(b"first_start", math.inf))
    arrivals.newest_start = float(meta.get(b"newest_start", -math.inf))
    return arrivals


def decode_counters(fields: dict[bytes, bytes]) -> EventCounters:
    counters = EventCounters()
    for raw_name, raw_value in fields.items():
        name, value = raw_name.decode(), int(raw_value)
        if name == "processed":
            counters.processed = value
        elif name == "duplicates":
            counters.duplicates = value
        elif name.startswith("rejected:"):
            counters.rejected[name.removeprefix("rejected:")] = value
    return counters
