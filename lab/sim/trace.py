"""The simulators' input: requests as columns in processing order (sizes in KV blocks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray


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
    def from_event_dicts(cls, events: Sequence[dict[str, Any]], block_size: int = 16) -> SimTrace:
        """Build from contract event dicts (SPEC section 2), ``block_hashes`` where given."""
        hashes = [e.get("block_hashes") for e in events]
        return cls.from_columns(
            [e["session_id"] for e in events],
            [e["turn"] for e in events],
            [e["timestamp"] for e in events],
            [e["input_tokens"] for e in events],
            block_size,
            block_hashes=hashes if any(h is not None for h in hashes) else None,
        )

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
