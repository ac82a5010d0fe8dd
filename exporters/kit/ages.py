"""The age grid of the ``density`` policy: a cached block's age (s) in buckets of
:data:`PER_OCTAVE` steps per doubling of ``1 + age``, and the clock times where a block's
bucket turns.

Defined once here: the density curves (``kvcast.exporters.kit.density``), the index, the
ranking and both adapters read a bucket as ``int(log1p(age) * BUCKET_SCALE)`` clipped to
``AGE_BUCKETS - 1`` (a hot path binds the constants to locals; it does not restate them).
Standard library only.
"""

from __future__ import annotations

import math

__all__ = [
    "AGE_BUCKETS",
    "BUCKET_SCALE",
    "FIRST_AGES",
    "PER_OCTAVE",
    "age_bucket",
    "bucket_age",
    "bucket_start",
    "flip_time",
]

PER_OCTAVE = 8  # age buckets per doubling of (1 + age s): steps of 9%
AGE_BUCKETS = PER_OCTAVE * 31  # up to 2^31 s of age; older ages share the last bucket
BUCKET_SCALE = PER_OCTAVE / math.log(2.0)  # buckets per unit of log(1 + age s)


def age_bucket(age_s: float) -> int:
    """The bucket of an age (s): ``floor(PER_OCTAVE * log2(1 + a))``, clipped to the grid."""
    if not age_s > 0.0:
        return 0
    k = int(math.log1p(age_s) * BUCKET_SCALE)
    return k if k < AGE_BUCKETS else AGE_BUCKETS - 1


def bucket_age(k: int) -> float:
    """The age (s) a bucket is valued at: the geometric middle of its ``1 + a`` range."""
    return 2.0 ** ((k + 0.5) / PER_OCTAVE) - 1.0


def bucket_start(k: int) -> float:
    """The first age (s) of bucket ``k``; ``bucket_start(k + 1)`` is where its value changes."""
    return 2.0 ** (k / PER_OCTAVE) - 1.0


def _first_age(k: int) -> float:
    """The smallest float age (s) that :func:`age_bucket` puts in bucket ``k`` or later:
    :func:`bucket_start`, moved to the float where ``int(log1p(a) * scale)`` turns."""
    if k <= 0:
        return 0.0
    age = bucket_start(k)
    while age_bucket(age) >= k:
        age = math.nextafter(age, -math.inf)
    while age_bucket(age) < k:
        age = math.nextafter(age, math.inf)
    return age


# The exact floats where the bucket turns, bucket 0 included (0.0): flip_time and the numpy
# ranking's binary search (kvcast.exporters.kit.ranking) both read them.
FIRST_AGES: tuple[float, ...] = tuple(_first_age(k) for k in range(AGE_BUCKETS))


def flip_time(origin_s: float, bucket: int) -> float:
    """The clock time (s) from which an item aged since ``origin_s`` (clock s) is in age
    bucket ``bucket`` or later: a float ``f`` with ``age_bucket(f - origin_s) >= bucket``,
    as computed in floating point, at most one step of the clock's float grid after the
    earliest such time.

    Whatever the clock's magnitude (0, ``time.monotonic()`` on a long-running host, epoch
    seconds, 1e12): an item whose age at ``now`` lies in a lower bucket has a flip time
    strictly after ``now`` (``a - origin_s`` never falls as ``a`` rises, nor ``age_bucket``
    as the age does), so a flip handled at ``now`` can never be due at ``now`` again. A nudge
    by a fixed fraction of a second cannot promise that: at 1.7e9 s the clock's floats are
    2.4e-7 s apart, at 1e12 s 1.2e-4 s. ``bucket`` in ``1 .. AGE_BUCKETS - 1``.
    """
    first = FIRST_AGES[bucket]
    when = origin_s + first
    # The sum rounds to the clock's grid, possibly below origin + first: step up to the next
    # float (once, barring a pathological origin) until the age there is in the bucket.
    while when - origin_s < first:
        when = math.nextafter(when, math.inf)
    return when
