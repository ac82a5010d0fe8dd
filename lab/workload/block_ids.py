"""Chain hashes of generated KV blocks: the ``block_hashes`` of SPEC section 2 for synthetic traces.

A block's id is a 63-bit hash of (its parent block's id, its content id), the parent of a chain's
first block being a per-trace key: so an id is determined by the whole prefix up to and including
its block, as an engine's prefix cache identifies blocks, and equal ids mean equal content at that
position of equal chains. The block simulator (``kvcast.lab.sim.block_cache``, which keys blocks
by their whole prefix) and a consumer that keys on the id alone therefore count the same reuse.

Content ids name what a block holds: block ``i`` of a named shared segment (a system prompt, a
tool set), block ``p`` of conversation ``c``'s own content, or the partly filled last block of one
request. That last block (the tail) is never shared: the next turn fills it further, so no later
request can match it (SPEC section 3's unhashable block), exactly as the simulator's synthesized
chains treat it. Hence a request of ``R`` blocks carries ``R - 1`` ids of its conversation's chain
plus one tail id of its own.

The hash is SplitMix64's finalizer on numpy ``uint64`` (wrapping arithmetic), vectorized across
conversations; collisions among 10**7 ids have probability about 10**-5.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
# Tags keep the three kinds of content apart even when their numbers coincide.
TAG_SEGMENT, TAG_OWN, TAG_TAIL = 0x5E6, 0x0C0, 0x7A1


def mix(z: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64's finalizer, elementwise: a bijection of uint64 that scatters every bit."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def content(tag: int, a: NDArray | int, b: NDArray | int) -> NDArray[np.uint64]:
    """Content id of the pair ``(a, b)`` of kind ``tag`` (uint64, elementwise)."""
    a64 = np.atleast_1d(np.asarray(a)).astype(np.uint64)
    b64 = np.atleast_1d(np.asarray(b)).astype(np.uint64)
    # The tag is scattered first: a plain ``tag ^ a`` would make (tag1, a1) and (tag2, a2)
    # collide whenever tag1 ^ tag2 == a1 ^ a2, which small row numbers reach.
    kind = mix(np.asarray([tag], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        return mix(mix(kind ^ a64) + b64)


def step(parent: NDArray[np.uint64], content_id: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """The chain state of a block: its parent's state and its content, hashed together."""
    return mix(mix(parent) ^ content_id)


def name_id(name: str) -> int:
    """A stable 64-bit number for a segment name (same name, same content)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def trace_key(seed: int) -> np.uint64:
    """The parent state of every chain's first block, keyed by the trace's seed."""
    return mix(np.asarray([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]


def segment_chain(key: np.uint64, segments: Sequence[tuple[str, int]]) -> NDArray[np.uint64]:
    """Chain states of a shared prefix made of ``(name, blocks)`` segments in order."""
    out = np.empty(sum(b for _, b in segments), dtype=np.uint64)
    state = np.asarray([key], dtype=np.uint64)
    k = 0
    for name, blocks in segments:
        ids = content(TAG_SEGMENT, name_id(name), np.arange(blocks))
        for i in range(blocks):
            state = step(state, ids[i : i + 1])
            out[k] = state[0]
            k += 1
    return out


def fill_own(
    chain: NDArray[np.uint64],
    start: NDArray[np.int64],
    base: NDArray[np.int64],
    length: NDArray[np.int64],
    conv: NDArray[np.int64],
    key: np.uint64,
) -> None:
    """Write, in place, the chain states of conversations' own blocks: for each conversation
    ``conv[i]`` (chain at ``chain[start[i]:start[i] + length[i]]``, the first ``base[i]`` blocks
    already written), positions ``base[i] .. length[i] - 1`` hold its own content."""
    if conv.size == 0:
        return
    top = int(length.max(initial=0))
    for p in range(int(base.min(initial=0)), top):
        active = np.flatnonzero((base <= p) & (p < length))
        if active.size == 0:
            continue
        at = start[active] + p
        parent = chain[at - 1] if p > 0 else np.full(active.size, key, dtype=np.uint64)
        chain[at] = step(parent, content(TAG_OWN, conv[active], p))


def tails(
    chain: NDArray[np.uint64],
    start: NDArray[np.int64],
    blocks: NDArray[np.int64],
    request: NDArray[np.int64],
    key: np.uint64,
) -> NDArray[np.uint64]:
    """Chain states of the requests' partly filled last blocks: request ``request[i]`` has
    ``blocks[i] >= 1`` blocks on the chain at ``start[i]``; its tail's content is the request
    itself, so no other block shares it."""
    prev = start + blocks - 2
    parent = np.where(blocks >= 2, chain[np.maximum(prev, 0)] if chain.size else key, key)
    return step(parent.astype(np.uint64), content(TAG_TAIL, request, 0))


def public(states: NDArray[np.uint64]) -> NDArray[np.int64]:
    """The published ids: 63 bits of each state, a JSON-safe non-negative int64."""
    return (np.asarray(states, dtype=np.uint64) >> np.uint64(1)).astype(np.int64)


@dataclass(frozen=True)
class BlockIds:
    """The ids of every request's blocks, stored once per conversation.

    ``chain`` holds each conversation's chain of full-block ids (63-bit), conversation ``c``'s at
    ``chain[start[c]:]``; request ``r`` (trace order) of ``R_r`` blocks is
    ``chain[start[conv_r]:start[conv_r] + R_r - 1]`` followed by ``tail[r]``. Where a
    conversation's content restarts (an agent's compacted context), its requests lie on several
    chains: ``request_chain[r]`` then indexes ``start`` instead of the conversation.
    """

    chain: NDArray[np.int64]
    start: NDArray[np.int64]
    tail: NDArray[np.int64]
    request_chain: NDArray[np.int64] | None = None

    def flat(
        self, conversation: NDArray[np.int64], blocks: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Every request's ids in trace order as one array and its offsets: request r's are
        ``ids[offsets[r]:offsets[r + 1]]`` (the simulator's ``BlockHashes``)."""
        owner = conversation if self.request_chain is None else self.request_chain
        r = blocks.astype(np.int64)
        offsets = np.zeros(r.size + 1, np.int64)
        np.cumsum(r, out=offsets[1:])
        within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], r)
        src = np.repeat(self.start[owner], r) + within
        ids = (
            self.chain[np.minimum(src, max(self.chain.size - 1, 0))]
            if self.chain.size
            else (np.zeros(src.size, np.int64))
        )
        ids[offsets[1:][r > 0] - 1] = self.tail[r > 0]
        return ids, offsets

    def lists(self, conversation: NDArray[np.int64], blocks: NDArray[np.int64]) -> list[list[int]]:
        """Every request's ids in trace order (``conversation``/``blocks`` per request)."""
        chain, tail = self.chain.tolist(), self.tail.tolist()
        owner = conversation if self.request_chain is None else self.request_chain
        starts = self.start[owner].tolist()
        out = []
        for s, r, t in zip(starts, blocks.tolist(), tail, strict=True):
            ids = chain[s : s + r - 1]
            ids.append(t)
            out.append(ids)
        return out
