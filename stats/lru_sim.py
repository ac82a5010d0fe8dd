"""Trace-driven cache simulators behind one registry: whole-content LRU (Algorithm 1) here,
the block-level prefix cache and its policies in ``kvcast.stats.block_sim``/``block_policies``.

A policy is a function ``(trace, capacity_blocks, **options) -> hit blocks per request`` (one
int per request, in trace order), registered under ``(name, granularity)``. ``simulate`` runs one
and measures the hit ratio over whole conversations (``kvcast.stats.measurement``).

Algorithm 1 (the mean-field paper, appendix B.4), sizes in KV blocks: requests are processed in
timestamp order (ties: lower turn first, then input order). A request of conversation c with
``R_j`` blocks hits iff c is resident; a hit reuses ``max(R_prev - 1, 0)`` blocks (the resident
content less its unhashable tail block), capped at ``R_j``; a miss reuses 0. Then c's content
becomes ``R_j``, c moves to the MRU end, and whole conversations are evicted from the LRU end
while the resident total exceeds N (c itself too, when ``R_j > N``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvcast.stats.measurement import measured_requests


@dataclass(frozen=True)
class SimTrace:
    """Requests in processing order. ``conversation`` holds dense ids ``0..conversations-1``;
    ``blocks`` is ``R_j = ceil(input_tokens / block_size)``; ``timestamp`` in seconds."""

    conversation: NDArray[np.int64]
    turn: NDArray[np.int64]
    timestamp: NDArray[np.float64]
    blocks: NDArray[np.int64]
    conversations: int
    intent: NDArray[np.int64] | None = None
    intent_names: tuple[str, ...] = ()
    block_hashes: tuple[Sequence[int | str] | None, ...] | None = None
    """Per request, the ids of its input's KV blocks in order (None: synthesize a chain)."""

    def __len__(self) -> int:
        return int(self.blocks.size)

    @classmethod
    def from_columns(
        cls,
        session: ArrayLike,
        turn: ArrayLike,
        timestamp: ArrayLike,
        input_tokens: ArrayLike,
        block_size: int = 16,
        intent: Sequence[str] | None = None,
        block_hashes: Sequence[Sequence[int | str] | None] | None = None,
    ) -> SimTrace:
        """Build from per-request columns in any order: sorts by (timestamp, turn), stably,
        and numbers sessions (strings or ints) densely with ``np.unique``. Where a request has
        ``block_hashes``, they define its blocks: ``R_j = len(block_hashes)``."""
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        ts = np.asarray(timestamp, dtype=np.float64)
        tn = np.asarray(turn, dtype=np.int64)
        tokens = np.asarray(input_tokens, dtype=np.int64)
        if not (ts.size == tn.size == tokens.size == len(session)):  # type: ignore[arg-type]
            raise ValueError("columns must have equal lengths")
        order = np.lexsort((tn, ts))
        keys, conv = np.unique(np.asarray(session), return_inverse=True)
        names: tuple[str, ...] = ()
        codes = None
        blocks = -(-tokens // block_size)
        hashes: tuple[Sequence[int | str] | None, ...] | None = None
        if block_hashes is not None and any(h is not None for h in block_hashes):
            if len(block_hashes) != ts.size:
                raise ValueError("block_hashes must have one entry per request")
            given = [k for k, h in enumerate(block_hashes) if h is not None]
            blocks[given] = [len(block_hashes[k]) for k in given]  # type: ignore[arg-type]
            hashes = tuple(block_hashes[k] for k in order.tolist())
        if intent is not None:
            uniq, inv = np.unique(np.asarray(intent, dtype=object).astype(str), return_inverse=True)
            names, codes = tuple(uniq.tolist()), inv.reshape(-1).astype(np.int64)[order]
        return cls(
            conversation=conv.reshape(-1).astype(np.int64)[order],
            turn=tn[order],
            timestamp=ts[order],
            blocks=blocks[order],
            conversations=int(keys.size),
            intent=codes,
            intent_names=names,
            block_hashes=hashes,
        )


class Policy(Protocol):
    def __call__(
        self, trace: SimTrace, capacity_blocks: int, **options: Any
    ) -> NDArray[np.int64]: ...


POLICIES: dict[tuple[str, str], Policy] = {}
"""(policy name, granularity) -> simulator returning hit blocks per request."""

PLANNED: dict[tuple[str, str], str] = {}
"""Policies of SPEC section 10 that are not implemented yet (for a clear error)."""


def register(name: str, granularity: str) -> Callable[[Policy], Policy]:
    def deco(fn: Policy) -> Policy:
        POLICIES[(name, granularity)] = fn
        return fn

    return deco


class PolicyUnavailable(ValueError):
    """The requested (policy, granularity) is unknown or not implemented yet."""


def get_policy(name: str, granularity: str = "conversation") -> Policy:
    try:
        return POLICIES[(name, granularity)]
    except KeyError:
        pass
    have = ", ".join(f"{p}/{g}" for p, g in sorted(POLICIES))
    if (name, granularity) in PLANNED:
        raise PolicyUnavailable(
            f"policy {name!r} with granularity {granularity!r} ({PLANNED[(name, granularity)]}) "
            f"is not implemented yet; available: {have}"
        )
    raise PolicyUnavailable(
        f"unknown policy {name!r} with granularity {granularity!r}; available: {have}"
    )


def lru_conversation_hits(
    conversation: ArrayLike, blocks: ArrayLike, capacity_blocks: int
) -> NDArray[np.int64]:
    """Algorithm 1 over requests in processing order; returns hit blocks per request.

    ``conversation``: any hashable ids (ints are fastest); ``blocks``: R_j per request.
    """
    if capacity_blocks < 0:
        raise ValueError("capacity_blocks must be >= 0")
    conv = np.asarray(conversation).tolist()
    size = np.asarray(blocks, dtype=np.int64).tolist()
    out = [0] * len(size)
    resident: OrderedDict[Any, int] = OrderedDict()  # LRU first, MRU last
    pop, popitem = resident.pop, resident.popitem
    total = 0
    cap = int(capacity_blocks)
    for k, (c, r) in enumerate(zip(conv, size, strict=True)):
        prev = pop(c, None)
        if prev is not None:
            total -= prev
            if prev > 1:
                out[k] = prev - 1 if prev - 1 <= r else r
        resident[c] = r
        total += r
        while total > cap:
            total -= popitem(last=False)[1]
    return np.asarray(out, dtype=np.int64)


@register("lru", "conversation")
def _lru_conversation(trace: SimTrace, capacity_blocks: int, **options: Any) -> NDArray[np.int64]:
    if options:
        raise TypeError(f"lru/conversation takes no options, got {sorted(options)}")
    return lru_conversation_hits(trace.conversation, trace.blocks, capacity_blocks)


@dataclass(frozen=True)
class SimResult:
    """Hit ratio = ``hit_blocks / input_blocks`` over the measured conversations (0.0 when
    nothing is measured); ``requests``/``conversations`` count the whole trace."""

    hit_ratio: float
    hit_blocks: int
    input_blocks: int
    measured_conversations: int
    measured_requests: int
    policy: str
    granularity: str
    capacity_blocks: int
    warmup_fraction: float
    cooldown_fraction: float
    requests: int
    conversations: int
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def simulate(
    trace: SimTrace,
    capacity_blocks: int,
    policy: str = "lru",
    granularity: str = "conversation",
    warmup_fraction: float = 0.2,
    cooldown_fraction: float = 0.2,
    **options: Any,
) -> SimResult:
    """Run ``policy`` over ``trace`` with ``capacity_blocks`` and measure its hit ratio."""
    fn = get_policy(policy, granularity)
    mask, n_conv = measured_requests(
        trace.conversation,
        trace.timestamp,
        trace.conversations,
        warmup_fraction,
        cooldown_fraction,
    )
    start = time.perf_counter()
    hits = fn(trace, capacity_blocks, **options)
    elapsed = time.perf_counter() - start
    hit_blocks = int(hits[mask].sum())
    input_blocks = int(trace.blocks[mask].sum())
    return SimResult(
        hit_ratio=hit_blocks / input_blocks if input_blocks else 0.0,
        hit_blocks=hit_blocks,
        input_blocks=input_blocks,
        measured_conversations=n_conv,
        measured_requests=int(mask.sum()),
        policy=policy,
        granularity=granularity,
        capacity_blocks=int(capacity_blocks),
        warmup_fraction=warmup_fraction,
        cooldown_fraction=cooldown_fraction,
        requests=len(trace),
        conversations=trace.conversations,
        elapsed_s=elapsed,
    )


# The block-level policies register themselves on import (after the registry exists).
from kvcast.stats import block_policies as _block_policies  # noqa: E402

del _block_policies
