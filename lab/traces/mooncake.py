"""Mooncake traces (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``).

There are no session ids: conversations are recovered from the ``hash_ids`` prefix chains.

Rule (SPEC section 10): requests are taken in timestamp order (ties: file order). Let ``c`` be the
number of leading ids shared by *every* request (a common system prompt; 0 when there is one
request). Request ``i`` continues the **most recent** earlier request ``j`` whose key is a prefix
of ``i``'s ids, is longer than ``c`` ids, and is not longer than ``i``'s ids. The key of ``j`` is

- ``match="full"`` (the SPEC's literal rule): all of ``j``'s ids;
- ``match="hashable"`` (the converter's default): ``j``'s ids without its last one when
  ``j``'s last block is partial (``input_length % block_size != 0``). A partial block's id
  covers fewer tokens than the block at the same place in the next turn's longer prompt, so it
  can never recur there; this is the unhashable tail block of SPEC section 3.

``i`` gets ``j``'s session and turn ``turn_j + 1``. A request has at most one continuation: when
``j`` already has one, ``i`` is a *fork* (a regenerated or branched prompt) and starts a new
conversation of its own (its shared blocks are still shared in the block-level simulator).
Cost: one dict lookup per block (the ids are interned in a trie of prefixes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from kvcast.lab.traces.common import ConversionSummary, TraceError, hash_list, need

MATCH_MODES = ("full", "hashable")
BLOCK_SIZE = 512  # tokens per Mooncake hash block


def common_prefix_length(hashes: Sequence[Sequence[int | str]]) -> int:
    """Leading ids shared by every request (0 with fewer than two requests)."""
    if len(hashes) < 2:
        return 0
    first = hashes[0]
    n = len(first)
    for ids in hashes[1:]:
        k = 0
        limit = min(n, len(ids))
        while k < limit and ids[k] == first[k]:
            k += 1
        n = k
        if n == 0:
            break
    return n


def recover_conversations(
    hashes: Sequence[Sequence[int | str]],
    input_lengths: Sequence[int] | None = None,
    *,
    block_size: int = BLOCK_SIZE,
    match: str = "full",
) -> tuple[list[int], list[int], dict[str, int]]:
    """Parents by the module's rule, for requests already in timestamp order.

    Returns ``(parent, turn, info)``: ``parent[i]`` is the index of the request ``i`` continues
    (-1 for a conversation start), ``turn[i]`` its 1-based turn, ``info`` holds ``common_prefix``
    (blocks) and ``forks``. ``input_lengths`` (tokens) are needed for ``match="hashable"``.
    """
    if match not in MATCH_MODES:
        raise ValueError(f"match must be one of {', '.join(MATCH_MODES)}, got {match!r}")
    if match == "hashable" and input_lengths is None:
        raise ValueError("match='hashable' needs input_lengths")
    c = common_prefix_length(hashes)
    trie: dict[tuple[int, int | str], int] = {}
    owner: dict[int, int] = {}  # trie node -> most recent request whose key ends there
    parent = [-1] * len(hashes)
    turn = [1] * len(hashes)
    continued: set[int] = set()
    forks = 0
    for i, ids in enumerate(hashes):
        node, best = 0, -1
        nodes: list[int] = []
        for depth, h in enumerate(ids, 1):
            nxt = trie.get((node, h))
            if nxt is None:
                nxt = len(trie) + 1
                trie[(node, h)] = nxt
            node = nxt
            nodes.append(node)
            if depth > c:
                j = owner.get(node, -1)
                if j > best and len(hashes[j]) <= len(ids):
                    best = j
        if best >= 0:
            if best in continued:
                forks += 1
            else:
                continued.add(best)
                parent[i], turn[i] = best, turn[best] + 1
        partial = (
            match == "hashable" and input_lengths is not None and input_lengths[i] % block_size != 0
        )
        k = len(ids) - 1 if partial else len(ids)
        if k > 0:
            owner[nodes[k - 1]] = i
    return parent, turn, {"common_prefix": c, "forks": forks}


def convert_mooncake(
    records: Iterable[tuple[int, Any]],
    *,
    block_size: int = BLOCK_SIZE,
    match: str = "hashable",
    session_prefix: str = "mc",
) -> tuple[list[dict[str, Any]], ConversionSummary]:
    """Events (timestamp order) from ``(line, record)`` pairs; raises :class:`TraceError`.

    Each event keeps ``block_hashes``; ``timestamp`` is in seconds (the trace's ms / 1000);
    ``request_id`` is ``{session_prefix}-r{line}``; ``session_id`` is ``{session_prefix}-{k}``
    with ``k`` the index (in timestamp order) of the conversation's first request.
    """
    rows: list[tuple[float, int, int, int, list[int | str]]] = []
    for line, obj in records:
        ts = need(obj, "timestamp", line, "number")
        inp = need(obj, "input_length", line, "int")
        out = need(obj, "output_length", line, "int")
        ids = hash_list(obj, "hash_ids", line)
        if len(ids) != math.ceil(inp / block_size):
            raise TraceError(
                line,
                f"hash_ids has {len(ids)} ids but input_length {inp} needs "
                f"ceil({inp}/{block_size}) = {math.ceil(inp / block_size)} blocks",
            )
        rows.append((float(ts) / 1000.0, line, inp, out, ids))
    rows.sort(key=lambda r: (r[0], r[1]))
    parent, turn, info = recover_conversations(
        [r[4] for r in rows], [r[2] for r in rows], block_size=block_size, match=match
    )
    session: list[int] = []
    events: list[dict[str, Any]] = []
    summary = ConversionSummary("mooncake", records=len(rows), extra={"match": match, **info})
    width = len(str(max(len(rows) - 1, 0)))
    for i, (ts, line, inp, out, ids) in enumerate(rows):
        root = i if parent[i] < 0 else session[parent[i]]
        session.append(root)
        summary.turns[turn[i]] += 1
        events.append(
            {
                "session_id": f"{session_prefix}-{root:0{width}d}",
                "turn": turn[i],
                "timestamp": ts,
                "input_tokens": inp,
                "output_tokens": out,
                "request_id": f"{session_prefix}-r{line}",
                "block_hashes": ids,
            }
        )
    summary.events = len(events)
    summary.conversations = summary.turns.get(1, 0)
    return events, summary
