"""The simulators' input: requests as columns in processing order (sizes in KV blocks)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray


class BlockHashes(Sequence[list[int]]):
    """Every request's block ids as one flat int64 array: request r's are
    ``ids[offsets[r]:offsets[r + 1]]``. 8 bytes an id, where a tuple of Python lists takes
    about 40 (10 M ids: 80 MB against ~400 MB); indexing gives request r's ids as a list."""

    __slots__ = ("ids", "offsets")

    def __init__(self, ids: NDArray[np.int64], offsets: NDArray[np.int64]) -> None:
        if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != ids.size:
            raise ValueError("offsets must run from 0 to the number of ids")
        self.ids = ids
        self.offsets = offsets

    @classmethod
    def pack(cls, hashes: Sequence[Sequence[int | str] | None]) -> BlockHashes | None:
        """The flat form of ``hashes`` if every request has ids and every id is an int in
        int64's range; None otherwise (strings, a request without ids: keep the sequences)."""
        if any(h is None for h in hashes):
            return None
        lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))  # type: ignore[arg-type]
        flat = itertools.chain.from_iterable(hashes)  # type: ignore[arg-type]
        # numpy would read "12" or 1.5 as 12 and 1: only ints (bools excluded) pack.
        if set(map(type, flat)) - {int}:
            return None
        try:
            ids = np.fromiter(
                itertools.chain.from_iterable(hashes),  # type: ignore[arg-type]
                dtype=np.int64,
                count=int(lengths.sum()),
            )
        except OverflowError:  # an id past int64: keep the Python ints
            return None
        offsets = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(ids, offsets)

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    @overload
    def __getitem__(self, r: int) -> list[int]: ...
    @overload
    def __getitem__(self, r: slice) -> list[list[int]]: ...
    def __getitem__(self, r: int | slice) -> list[int] | list[list[int]]:
        if isinstance(r, slice):
            return [self[k] for k in range(*r.indices(len(self)))]
        if r < 0:
            r += len(self)
        if not 0 <= r < len(self):
            raise IndexError("request index out of range")
        return self.ids[self.offsets[r] : self.offsets[r + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        ids, offs = self.ids, self.offsets.tolist()
        for a, b in itertools.pairwise(offs):
            yield ids[a:b].tolist()

    def take(self, order: NDArray[np.int64]) -> BlockHashes:
        """The requests in ``order`` (a permutation or selection of request indices)."""
        lengths = np.diff(self.offsets)[order]
        offsets = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        return BlockHashes(self.ids[np.repeat(self.offsets[:-1][order], lengths) + within], offsets)


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
    block_hashes: BlockHashes | tuple[Sequence[int | str] | None, ...] | None = None
    """Per request, the ids of its input's KV blocks in order (None: synthesize a chain);
    :class:`BlockHashes` where every request has int ids (``from_columns`` packs them)."""

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
        hashes: BlockHashes | tuple[Sequence[int | str] | None, ...] | None = None
        if block_hashes is not None and any(h is not None for h in block_hashes):
            if len(block_hashes) != ts.size:
                raise ValueError("block_hashes must have one entry per request")
            given = [k for k, h in enumerate(block_hashes) if h is not None]
            blocks[given] = [len(block_hashes[k]) for k in given]  # type: ignore[arg-type]
            packed = (
                block_hashes
                if isinstance(block_hashes, BlockHashes)
                else BlockHashes.pack(block_hashes)
            )
            if packed is not None:
                # Files in timestamp order (the usual case) need no copy.
                in_order = bool(np.all(order[1:] > order[:-1])) if order.size > 1 else True
                hashes = packed if in_order else packed.take(order)
            else:
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
