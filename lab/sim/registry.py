"""The simulators behind one registry, filled explicitly below, and the measured run.

A policy is a function ``(trace, capacity_blocks, **options) -> hit blocks per request`` (one
int per request, in trace order), listed in :data:`POLICIES` under ``(name, granularity)``:
whole-content LRU (Algorithm 1, ``kvcast.lab.sim.lru``), whole-content IAC and density
(``kvcast.lab.sim.conversation_policies``) and the block-level prefix cache's policies
(``kvcast.lab.sim.block_policies``). ``simulate`` runs one and measures the hit ratio
over whole conversations (``kvcast.lab.sim.measurement``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from kvcast.lab.sim import block_policies, conversation_policies
from kvcast.lab.sim.lru import lru_conversation
from kvcast.lab.sim.measurement import measured_requests
from kvcast.lab.sim.trace import SimTrace


class Policy(Protocol):
    def __call__(
        self, trace: SimTrace, capacity_blocks: int, **options: Any
    ) -> NDArray[np.int64]: ...


POLICIES: dict[tuple[str, str], Policy] = {
    ("lru", "conversation"): lru_conversation,
    ("iac", "conversation"): conversation_policies.iac_conversation,
    ("density", "conversation"): conversation_policies.density_conversation,
    ("lru", "block"): block_policies.lru_block,
    ("lfu", "block"): block_policies.lfu_block,
    ("gdsf", "block"): block_policies.gdsf_block,
    ("iac", "block"): block_policies.iac_block,
    ("iac-rolling", "block"): block_policies.iac_rolling_block,
    ("density", "block"): block_policies.density_block,
    ("tbs", "block"): block_policies.tbs_block,
}
"""(policy name, granularity) -> simulator returning hit blocks per request."""

PLANNED: dict[tuple[str, str], str] = {}
"""Policies of SPEC section 10 that are not implemented yet (for a clear error)."""


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
    start = time.perf_counter()
    hits = fn(trace, capacity_blocks, **options)
    elapsed = time.perf_counter() - start
    return measure(
        trace, hits, capacity_blocks, policy, granularity, warmup_fraction, cooldown_fraction,
        elapsed,
    )  # fmt: skip


def measure(
    trace: SimTrace,
    hits: NDArray[np.int64],
    capacity_blocks: int,
    policy: str,
    granularity: str,
    warmup_fraction: float = 0.2,
    cooldown_fraction: float = 0.2,
    elapsed_s: float = 0.0,
) -> SimResult:
    """The result of a run that gave ``hits`` (hit blocks per request), over the measured
    conversations (``warmup_fraction`` / ``cooldown_fraction`` of first-turn times)."""
    mask, n_conv = measured_requests(
        trace.conversation,
        trace.timestamp,
        trace.conversations,
        warmup_fraction,
        cooldown_fraction,
    )
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
        elapsed_s=elapsed_s,
    )
