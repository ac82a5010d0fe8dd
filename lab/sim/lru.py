"""Whole-content LRU, the mean-field paper's Algorithm 1.

Algorithm 1 (the mean-field paper, appendix B.4), sizes in KV blocks: requests are processed in
timestamp order (ties: lower turn first, then input order). A request of conversation c with
``R_j`` blocks hits iff c is resident; a hit reuses ``max(R_prev - 1, 0)`` blocks (the resident
content less its unhashable tail block), capped at ``R_j``; a miss reuses 0. Then c's content
becomes ``R_j``, c moves to the MRU end, and whole conversations are evicted from the LRU end
while the resident total exceeds N (c itself too, when ``R_j > N``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvcast.lab.sim.trace import SimTrace


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


def lru_conversation(trace: SimTrace, capacity_blocks: int, **options: Any) -> NDArray[np.int64]:
    """Algorithm 1 as a simulator policy: hit blocks per request of ``trace``."""
    if options:
        raise TypeError(f"lru/conversation takes no options, got {sorted(options)}")
    return lru_conversation_hits(trace.conversation, trace.blocks, capacity_blocks)
