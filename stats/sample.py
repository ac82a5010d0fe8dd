"""The workload sample: what the statistics window hands to the forecast.

Everything the mean-field forecast needs, in plain arrays, so that the forecast never sees
events, buckets or stores. Sizes are in KV blocks, times in seconds of event time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class IntentMoments:
    """Sums over the completed conversations of one intent (blocks; counts)."""

    conversations: int
    sum_R: float  # sum over conversations of sum_{j=1..M} R_j
    sum_H: float  # sum of sum_{j<M} R_j: the history Algorithm 1 moves on revisits
    sum_H_hash: float  # sum of sum_{j<M} max(R_j - 1, 0): the hashable (reusable) history
    sum_B: float  # sum of R_M
    sum_M: float  # sum of M (turns)
    # Shared prefixes (zero without block hashes): leading shared blocks over all turns, over
    # final turns, and shared blocks' lives (one per block that became shared).
    sum_S: float = 0.0
    sum_S_B: float = 0.0
    shared_born: float = 0.0


@dataclass(frozen=True)
class WorkloadSample:
    """Window contents for the forecast.

    ``delay_s[k]`` is one inter-turn delay ``W_t = ts_{t+1} - ts_t`` (seconds) of a completed
    conversation; ``prev_blocks[k]`` is ``R_t``, the block count of the turn it leaves (the
    content that turn t+1 revisits); ``intent[k]`` indexes ``intents``; ``turn[k]`` is t
    (already capped at ``max_turn``). ``by_intent`` holds per-intent conversation sums in the
    order of ``intents``. ``lambda0`` is conversations per second over the rate window, or
    None when fewer than two conversation starts have been seen.

    Shared prefixes: ``prev_shared[k]`` of ``prev_blocks[k]`` are leading blocks that the
    revisit finds shared with other conversations (counted as shared-block references);
    ``shared_gap_s``/``shared_gap_blocks``: shared blocks referenced again after a gap (s),
    blocks per distinct gap. None: no shared prefixes.
    """

    intents: tuple[str, ...]
    by_intent: tuple[IntentMoments, ...]
    delay_s: NDArray[np.float64]
    prev_blocks: NDArray[np.int64]
    intent: NDArray[np.int32]
    turn: NDArray[np.int32]
    lambda0: float | None
    observed_hit_ratio: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    prev_shared: NDArray[np.int64] | None = None
    shared_gap_s: NDArray[np.float64] | None = None
    shared_gap_blocks: NDArray[np.int64] | None = None

    @property
    def conversations(self) -> int:
        return sum(m.conversations for m in self.by_intent)

    def total(self) -> IntentMoments:
        """Sums over all intents."""
        return IntentMoments(
            conversations=self.conversations,
            sum_R=sum(m.sum_R for m in self.by_intent),
            sum_H=sum(m.sum_H for m in self.by_intent),
            sum_H_hash=sum(m.sum_H_hash for m in self.by_intent),
            sum_B=sum(m.sum_B for m in self.by_intent),
            sum_M=sum(m.sum_M for m in self.by_intent),
            sum_S=sum(m.sum_S for m in self.by_intent),
            sum_S_B=sum(m.sum_S_B for m in self.by_intent),
            shared_born=sum(m.shared_born for m in self.by_intent),
        )

    @property
    def has_shared(self) -> bool:
        """Whether the window saw shared prefixes (events with block hashes that share)."""
        return self.total().sum_S > 0
