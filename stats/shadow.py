"""A spatially sampled shadow simulation of the block-level LRU prefix cache (SPEC section 12).

The live ground truth beside the forecast: fed one event at a time, it measures the hit ratio an
LRU prefix cache of each curve capacity (KV blocks, per instance) would have had on the stream,
with bounded memory and a cost per event that does not grow with the event rate.

**Semantics** are those of ``kvcast simulate --granularity block --policy lru`` (the exact
simulator, ``kvcast.lab.sim.block_cache``): a block is identified by its whole prefix, a request
hits its longest resident prefix, its blocks are then resident (only the first ``capacity`` of a
request longer than the cache) and eviction takes the least recently used *leaf*, a request's
blocks tail first. Leaf-first LRU is a stack algorithm here: if every request moves its blocks to
the top of one LRU stack tail first (its head ends on top), a block's parent is always above it,
so the lowest block of the stack is always a leaf and the resident set of a cache of capacity C
is the top C of the stack (inclusion). A request's hits at capacity C are then its blocks whose
stack distance (blocks above it), read when the request starts, is below C; one stack serves
every capacity. Blocks of a request come from ``block_hashes`` where the event has them; else
they are synthesized as the simulator does: the conversation's chain ``0 .. R-2`` plus an own
tail block, ``R = ceil(input_tokens / block_size)``. Hit ratio = reused input blocks / input
blocks.

**Keys.** Position p of a request with ids ``x_0 .. x_{R-1}`` is keyed by a 64-bit rolling hash
of ``x_0 .. x_p`` (a polynomial over 2^64 of the scrambled ids, :func:`prefix_keys`), so equal
ids under different prefixes never match; a synthesized chain block by (session, p); a tail by a
counter (never reused). Ids ``-1`` and ``2**64 - 1`` (and other pairs equal modulo 2^64) share a
key.

**Sampling** (SHARDS, Waldspurger et al., FAST'15, fixed rate): a block is kept iff its key's
top 24 bits, read as a fraction, are below ``sampling``; a synthesized chain's kept positions are
drawn with geometric gaps from the session's key (the same Bernoulli(``sampling``) choice per
block, at a cost proportional to the kept blocks, not the chain). The kept blocks run through
one stack (:class:`LruStack`, O(log n) per access) of at most ``floor(max capacity * sampling)
+ 1`` entries; a kept access at sampled distance k counts at capacity C as a hit of weight
``clamp(C * sampling - k, 0, 1)`` (see :class:`ShadowCounters`: SHARDS' plain ``k < C *
sampling`` overstates small sampled caches by up to one block). The hit ratio of the kept
accesses estimates the full one; rate 1 is the exact simulation. One stack for all 17 curve
capacities cost 2.4-3.1x less per event than one LRU per capacity (17 OrderedDicts) in
``kvcast bench --suite shadow`` (``lab/bench/shadow_bench.py``), which also measures error,
memory and CPU.
:meth:`ShadowCounters.window_start` picks the published window: the newest event-time slots
holding ``DEFAULT_MIN_ACCESSES`` kept accesses, since the error falls as 1/sqrt(kept accesses).

**Instances.** With ``instances`` > 1 behind session-affine routing each instance's cache sees
its sessions only (shared blocks included), so the shadow simulates one instance: it keeps a
session iff a second, independent hash of its ``session_id`` falls below ``1 / (instances *
stream_share)`` (capped at 1), ``stream_share`` being the fraction of all sessions this feed
receives (1 when one process sees every partition). If the feed sees less than one instance's
share, it keeps all its sessions and shrinks the simulated capacity by ``instances *
stream_share`` instead (exact for conversations' own blocks, optimistic for shared ones).

**Checkpoints.** What is effectively-once and what is not:

- The counters (:class:`ShadowCounters`: per event-time slot, sampled accesses by the smallest
  curve capacity at which they hit) are additive and mergeable. :meth:`ShadowSimulator.observe`
  records an event's outcome into the counters the caller passes (e.g. the delta of the
  event's partition, committed with its offsets like the other statistics), so a committed event
  is counted exactly once and an uncommitted one is counted again only in the delta that replaces
  the lost one. (De)serialisation: :meth:`ShadowCounters.to_dict` and ``from_dict``.
- The sampled cache's contents (the LRU stack) are *not* checkpointed: after a restart the stack
  starts empty and is rebuilt from the events that follow, so hit ratios recorded just after a
  restart are biased low until about ``max capacity * sampling`` kept blocks have gone
  through; ``warmup_s`` skips recording for that long (event time) after the first event a
  simulator sees. A replayed event is therefore judged against a colder cache than before the
  crash, but never counted twice.

Pure computation: no I/O, no imports outside ``kvcast.stats`` (and the standard library, numpy).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from kvcast.stats.lru_stack import LruStack
from kvcast.stats.shadow_counters import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MIN_ACCESSES,
    DEFAULT_SLOT_S,
    ShadowCounters,
    ShadowPoint,
)

if TYPE_CHECKING:
    from kvcast.stats.events import Event

DEFAULT_SAMPLING = 0.05
"""Fraction of blocks the shadow keeps by default (``--shadow-sampling``). Measured on 10^6
generated requests (``single``, lambda0 = 1, 13.6 M blocks; 17 capacities N/16 .. 16N, N =
2275; 3 sampling seeds), max abs error against the exact simulation: 0.0064 at 0.01, 0.0046
at 0.02, 0.0027-0.0032 at 0.05, 0.0025 at 0.1 (``kvcast bench --suite shadow``). The error
falls as 1/sqrt(kept accesses): at 0.05 it is 0.0094 on the first 10^5 requests (68,000 kept
accesses), 0.0103 at 0.01 on 1.8 * 10^5. The CPU per event hardly depends on the rate (a fixed
~3-4 us per event, ~4 us per kept access, 0.68 kept accesses per event at 0.05), so the default
favours the sample: within 0.01 from about 10^5 kept accesses, 1.5 * 10^5 requests."""

_M64 = (1 << 64) - 1
_FRACTION_BITS = 24  # sampling resolution: a key's top 24 bits, 1 / 16.7 million
_SHIFT = 64 - _FRACTION_BITS
_GOLDEN = 0x9E3779B97F4A7C15
_BASE = 0x100000001B3 | 1  # odd, so invertible modulo 2^64 (the rolling hash needs its inverse)
_BASE_INV = pow(_BASE, -1, 1 << 64)
_SEED_ID = 0x94D049BB133111EB
_SEED_CHAIN = 0xC2B2AE3D27D4EB4F
_SEED_GAP = 0x165667B19E3779F9
_SEED_TAIL = 0xD6E8FEB86659FD93
_SALT_STR = 0x27D4EB2F165667C5  # keeps string ids apart from integer ids


def _mix(z: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit ints that spreads every input bit."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _id64(value: int | str) -> int:
    """A block id as 64 bits: integers modulo 2^64, strings by a stable hash."""
    if isinstance(value, str):
        digest = hashlib.blake2b(value.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") ^ _SALT_STR
    return int(value) & _M64


class _Powers:
    """``base**p`` and ``base**-p`` modulo 2^64 for p < len, grown on demand."""

    def __init__(self) -> None:
        self.fwd = np.ones(0, np.uint64)
        self.inv = np.ones(0, np.uint64)

    def get(self, n: int) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        if n > self.fwd.size:
            size = max(n, 2 * self.fwd.size, 64)
            fwd, inv, f, g = [], [], 1, 1
            for _ in range(size):
                fwd.append(f)
                inv.append(g)
                f, g = (f * _BASE) & _M64, (g * _BASE_INV) & _M64
            self.fwd, self.inv = np.array(fwd, np.uint64), np.array(inv, np.uint64)
        return self.fwd[:n], self.inv[:n]


_POWERS = _Powers()


_U_SHIFT = np.uint64(32)
_U_SEED = np.uint64(_SEED_ID)
_U_MUL1 = np.uint64(0xFF51AFD7ED558CCD)
_U_MUL2 = np.uint64(0xC4CEB9FE1A85EC53)


def scramble(value: int) -> int:
    """The per-id scramble of :func:`prefix_keys` for one 64-bit id (the test's reference)."""
    z = ((value ^ _SEED_ID) * 0xFF51AFD7ED558CCD) & _M64
    return ((z ^ (z >> 32)) * 0xC4CEB9FE1A85EC53) & _M64


def prefix_keys(ids: Sequence[int | str], salt: int = 0) -> NDArray[np.uint64]:
    """Key of every position of a request's ``block_hashes``: a hash of the ids up to it.

    ``H_p = H_{p-1} * base + s(x_p)`` modulo 2^64 with ``s`` a multiply-xorshift scramble of
    the id (so that small or structured ids do not make the polynomial linear in them),
    computed for all p at once as ``base**p * cumsum(s(x_i) * base**-i)``. Each position adds
    a fresh scrambled id, so the top bits of ``H_p`` are uniform and the sampling test reads
    them directly; ``salt`` (another sample) changes every scramble. A handful of numpy calls
    per request, whatever its length: the per-call cost dominates at tens of blocks."""
    n = len(ids)
    if n == 0:
        return np.zeros(0, np.uint64)
    arr = np.asarray(ids)
    if arr.dtype == np.int64:
        x = arr.view(np.uint64)
    elif arr.dtype == np.uint64:
        x = arr
    else:  # strings, mixed types or ids beyond int64: one at a time
        x = np.fromiter((_id64(v) for v in ids), np.uint64, n)
    fwd, inv = _POWERS.get(n)
    # The offset keeps id 0 away from 0 (else [0] and [0, 0] would share a key). In place
    # where it can: at tens of blocks the calls, not the arithmetic, cost.
    z = x ^ (_U_SEED if salt == 0 else np.uint64(_SEED_ID ^ salt))
    z *= _U_MUL1
    z ^= z >> _U_SHIFT
    z *= _U_MUL2
    z *= inv
    z = z.cumsum(dtype=np.uint64)
    z *= fwd
    return z


class ShadowSimulator:
    """The sampled block-level LRU shadow at ``capacities`` (blocks per instance, ascending).

    ``sampling`` in (0, 1] is the fraction of blocks kept; ``block_size`` tokens per block
    for events without ``block_hashes``; ``instances`` / ``stream_share`` as in the module
    doc; ``warmup_s`` (event time after the first event) simulated but not counted;
    ``seed`` draws another sample (0: the default one, the same in every process)."""

    def __init__(
        self,
        capacities: Sequence[float],
        sampling: float = DEFAULT_SAMPLING,
        *,
        block_size: int = 16,
        instances: int = 1,
        stream_share: float = 1.0,
        slot_s: float = DEFAULT_SLOT_S,
        warmup_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        caps = [float(c) for c in capacities]
        if not caps or any(not (c >= 0 and math.isfinite(c)) for c in caps):
            raise ValueError("capacities must be a non-empty list of finite values >= 0 blocks")
        if any(b < a for a, b in itertools.pairwise(caps)):
            raise ValueError("capacities must be ascending")
        if not 0 < sampling <= 1:
            raise ValueError(f"sampling must be in (0, 1], got {sampling}")
        if block_size < 1 or instances < 1 or not 0 < stream_share <= 1 or warmup_s < 0:
            raise ValueError("block_size, instances >= 1; stream_share in (0, 1]; warmup_s >= 0")
        self.capacities = tuple(caps)
        self.sampling = float(sampling)
        self.block_size = block_size
        seen = instances * stream_share  # instances' worth of sessions this feed receives
        self.session_rate = min(1.0, 1.0 / seen)
        self.capacity_scale = min(1.0, seen)
        # Capacity c in sampled blocks (a kept access's hit weight: ShadowCounters).
        self.thresholds = [c * self.sampling * self.capacity_scale for c in caps]
        # Distances up to floor(t) matter (the fractional hit at k = floor(t)).
        self.stack = LruStack(math.floor(max(self.thresholds)) + 1 if max(caps) > 0 else 0)
        self._keep_below = round(self.sampling * (1 << _FRACTION_BITS))
        self._session_below = round(self.session_rate * (1 << _FRACTION_BITS))
        self._log_skip = math.log1p(-self.sampling) if self.sampling < 1 else -math.inf
        self._salt = _mix(seed * _GOLDEN + _SEED_GAP) if seed else 0
        self._salt_bytes = self._salt.to_bytes(8, "little") if seed else b""
        self._rng = random.Random(seed)  # only the tails' countdown
        self._tail_skip = 0
        self.counters = ShadowCounters(caps, slot_s, self.thresholds)
        self.warmup_s = float(warmup_s)
        self._count_from: float | None = None
        self._tails = 0
        self.events = 0  # events fed
        self.kept_events = 0  # events with a kept access

    # -- keys ---------------------------------------------------------------------------------

    def _gap(self, u: float) -> int:
        """Blocks skipped before the next kept one, from a uniform ``u`` in (0, 1]: geometric,
        so every block is kept with probability ``sampling``, independently."""
        return int(math.log(u) / self._log_skip)

    def _chain_keys(self, session_key: int, first: float, count: int) -> list[int]:
        """Kept keys of a synthesized chain's positions ``0 .. count-1``, head first; ``first``
        is the session's uniform for its first gap."""
        if count <= 0:
            return []
        if self.sampling >= 1:
            return [_mix(session_key + (p + 1) * _SEED_CHAIN) for p in range(count)]
        # Geometric gaps from a per-session sequence: the same positions for every event of
        # the session, each kept with probability `sampling`, at O(kept) cost.
        pos = self._gap(first)
        out, k = [], 0
        while pos < count:
            out.append(_mix(session_key + (pos + 1) * _SEED_CHAIN))
            k += 1
            u = ((_mix(session_key ^ (k * _SEED_GAP)) >> 11) + 1) / 9007199254740992.0
            pos += 1 + self._gap(u)
        return out

    def _tail_key(self) -> int | None:
        """The key of a new request's own tail block, or None when it is not kept. Tails are
        never reused, so which ones are kept needs no hash: a countdown of geometric gaps."""
        self._tails += 1
        if self._tail_skip > 0:
            self._tail_skip -= 1
            return None
        if self.sampling < 1:
            self._tail_skip = self._gap(1.0 - self._rng.random())
        return _mix(self._tails * _GOLDEN ^ self._salt ^ _SEED_TAIL)

    def _session_bits(self, session_id: str) -> int:
        """192 bits of a keyed hash: 64 the session's key, 24 its pick, 64 its first gap."""
        digest = hashlib.blake2b(session_id.encode(), digest_size=24, key=self._salt_bytes)
        return int.from_bytes(digest.digest(), "little")

    def keeps_session(self, session_id: str) -> bool:
        """Whether the simulated instance serves this session (always when instances = 1)."""
        if self.session_rate >= 1:
            return True
        return (self._session_bits(session_id) >> 64) & 0xFFFFFF < self._session_below

    def keys(self, event: Event) -> list[int] | None:
        """Kept block keys of an event in position order (None: its session is not kept)."""
        bits = self._session_bits(event.session_id)
        if self.session_rate < 1 and (bits >> 64) & 0xFFFFFF >= self._session_below:
            return None
        hashes = event.block_hashes
        if hashes is not None:
            keys = prefix_keys(hashes, self._salt)
            if self.sampling < 1:
                keys = keys[(keys >> np.uint64(_SHIFT)) < np.uint64(self._keep_below)]
            return keys.tolist()
        blocks = -(-event.input_tokens // self.block_size)
        if blocks == 0:
            return []
        first = ((bits >> 139) + 1) / 9007199254740992.0  # the top 53 bits, in (0, 1]
        out = self._chain_keys(bits & _M64, first, blocks - 1)
        tail = self._tail_key()
        if tail is not None:
            out.append(tail)
        return out

    # -- the simulation -----------------------------------------------------------------------

    def observe(self, event: Event, counters: ShadowCounters | None = None) -> list[int]:
        """Simulate one request; record its kept accesses into ``counters`` (default: this
        simulator's own). Returns, per kept access in position order, the index of the
        smallest capacity at which it is a whole hit (``len(capacities)``: none); at rate 1
        the request's hits at capacity i are the accesses with an index <= i."""
        self.events += 1
        keys = self.keys(event)
        if not keys:
            return []
        self.kept_events += 1
        stack, thresholds = self.stack, self.thresholds
        miss = len(thresholds)
        below, upto = [], []
        for key in keys:  # distances as the request starts: its own blocks are pinned
            d = stack.distance(key)
            if d is None:
                below.append(miss)
                upto.append(miss)
            else:
                below.append(bisect_left(thresholds, d + 1))  # d < floor(t) <=> t >= d + 1
                upto.append(bisect_left(thresholds, d))  # d <= floor(t) <=> t >= d
        for key in reversed(keys):  # tail first, so the head ends on top
            stack.touch(key)
        ts = event.timestamp
        if self._count_from is None:
            self._count_from = ts + self.warmup_s
        if ts >= self._count_from:
            (self.counters if counters is None else counters).record(ts, below, upto)
        return below

    def curve(
        self,
        now_s: float | None = None,
        min_accesses: int = DEFAULT_MIN_ACCESSES,
        max_age_s: float = DEFAULT_MAX_AGE_S,
    ) -> list[ShadowPoint]:
        """The measured curve over the newest slots holding ``min_accesses`` kept accesses,
        none older than ``max_age_s`` before ``now_s`` (see ``ShadowCounters.window_start``)."""
        return self.counters.curve(self.counters.window_start(min_accesses, max_age_s, now_s))

    def memory_entries(self) -> int:
        """Python objects the sampled cache holds (bounded by the largest capacity)."""
        return self.stack.entries()
