"""A generated trace: one row per request, the events it writes and the simulator's view.

Units: timestamps in seconds, sizes in KV blocks and tokens. No file I/O here:
``Trace.jsonl_lines()`` yields bytes to write.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import orjson
from numpy.typing import NDArray

from kvcast.lab.workload import block_ids as bid
from kvcast.lab.workload.prompts import prompt_text

if TYPE_CHECKING:
    from kvcast.lab.sim.trace import SimTrace


@dataclass(frozen=True)
class Lineage:
    """Where each conversation's leading blocks come from, arrays indexed by conversation.

    ``prefix``: index of its shared prefix in ``Sharing.prefixes`` (-1: a branch, or none);
    ``parent``: the conversation it branches from (-1: a root); ``parent_turn``: the parent's
    turn it continues (0 for a root); ``base``: blocks it inherits (the prefix's, or the parent's
    turn-``parent_turn`` blocks less one), KV blocks.
    """

    prefix: NDArray[np.int64]
    parent: NDArray[np.int64]
    parent_turn: NDArray[np.int64]
    base: NDArray[np.int64]


@dataclass(frozen=True)
class Trace:
    """A generated trace, one row per request, sorted by timestamp (stable).

    ``conversation`` numbers conversations in arrival order; ``blocks`` is R_j;
    ``intent`` indexes ``intent_names``; ``cached_tokens`` is None unless requested;
    ``block_ids`` (the events' ``block_hashes``) and ``lineage`` are None without sharing.
    """

    conversation: NDArray[np.int64]
    turn: NDArray[np.int64]
    timestamp: NDArray[np.float64]
    input_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]
    blocks: NDArray[np.int64]
    intent: NDArray[np.int64]
    intent_names: tuple[str, ...]
    block_size: int
    conversations: int
    session_prefix: str = "c"
    prompt_choice: NDArray[np.int64] | None = None
    cached_tokens: NDArray[np.int64] | None = None
    meta: dict[str, object] = field(default_factory=dict)
    block_ids: bid.BlockIds | None = None
    lineage: Lineage | None = None

    def __len__(self) -> int:
        return int(self.turn.size)

    def block_hashes(self) -> list[list[int]] | None:
        """Every request's block ids in trace order (None when the trace has none)."""
        if self.block_ids is None:
            return None
        return self.block_ids.lists(self.conversation, self.blocks)

    def sim_trace(self) -> SimTrace:
        """The simulator's view of this trace (same request order; block ids where given)."""
        from kvcast.lab.sim.trace import BlockHashes, SimTrace

        hashes = None
        if self.block_ids is not None:
            hashes = BlockHashes(*self.block_ids.flat(self.conversation, self.blocks))
        return SimTrace(
            conversation=self.conversation,
            turn=self.turn,
            timestamp=self.timestamp,
            blocks=self.blocks,
            conversations=self.conversations,
            intent=self.intent,
            intent_names=self.intent_names,
            block_hashes=hashes,
        )

    def measurement_fractions(
        self, warmup: float = 0.2, cooldown: float = 0.2
    ) -> tuple[float, float]:
        """Warm-up and cool-down fractions of the span of first-turn times (what the
        simulators take, SPEC section 4) that measure the conversations starting in
        ``[warmup, 1 - cooldown]`` of the *roots'* arrival span.

        A branch starts after a turn of its parent, and a late turn's branch can start hours
        after the last root: the middle of the span of every first turn would then lie in the
        tail where arrivals have stopped and the cache empties (4,000 `production` roots
        arrive in 2,617 s and their first turns, branches included, span 16,311 s: 33
        conversations fell in its middle 60 %). Without branches: ``(warmup, cooldown)``.
        """
        from kvcast.lab.sim.measurement import first_times

        first = first_times(self.conversation, self.timestamp, self.conversations)
        seen = np.isfinite(first)
        roots = seen if self.lineage is None else seen & (self.lineage.parent < 0)
        if not roots.any() or np.array_equal(roots, seen):  # no branch: the plain fractions
            return warmup, cooldown
        lo, hi = float(first[seen].min()), float(first[seen].max())
        r_lo, r_hi = float(first[roots].min()), float(first[roots].max())
        if hi <= lo:
            return warmup, cooldown
        start, end = r_lo + warmup * (r_hi - r_lo), r_hi - cooldown * (r_hi - r_lo)
        return (start - lo) / (hi - lo), (hi - end) / (hi - lo)

    def session_ids(self) -> list[str]:
        width = max(6, len(str(max(self.conversations - 1, 0))))
        return [f"{self.session_prefix}{c:0{width}d}" for c in self.conversation.tolist()]

    def events(self) -> Iterator[dict[str, object]]:
        """Event dicts of the SPEC section 2 contract, in timestamp order."""
        cols = [
            a.tolist()
            for a in (self.turn, self.timestamp, self.input_tokens, self.output_tokens, self.intent)
        ]
        choice = self.prompt_choice.tolist() if self.prompt_choice is not None else None
        cached = self.cached_tokens.tolist() if self.cached_tokens is not None else None
        hashes = self.block_hashes()
        for k, sid in enumerate(self.session_ids()):
            turn, ts, inp, outp, intent = (c[k] for c in cols)
            ev: dict[str, object] = {
                "session_id": sid,
                "turn": turn,
                "timestamp": ts,
                "input_tokens": inp,
                "output_tokens": outp,
                "request_id": f"{sid}:{turn}",
                "intent": self.intent_names[intent],
            }
            if choice is not None:
                ev["prompt"] = prompt_text(self.intent_names[intent], turn, choice[k])
            if cached is not None:
                ev["cached_tokens"] = cached[k]
            if hashes is not None:
                ev["block_hashes"] = hashes[k]
            yield ev

    def jsonl_lines(self) -> Iterator[bytes]:
        """One orjson-encoded event per line, newline included."""
        for ev in self.events():
            yield orjson.dumps(ev) + b"\n"
