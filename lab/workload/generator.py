"""Synthetic workloads from the mean-field paper's multi-turn conversation model, with intents.

Conversations arrive as a Poisson process of rate ``lambda0`` (per second). Each draws an intent
from a mix; the intent fixes its turn-count law (continuation probability after turn t), its
inter-turn delays ``W_t`` (seconds; exponential or log-normal, per turn), its block increments
``Z_j >= 1`` (KV blocks) and its output tokens. Turn j carries ``R_j = sum_{l<=j} Z_l`` blocks and
``input_tokens`` with ``ceil(input_tokens / block_size) == R_j`` exactly.

Sharing across conversations (``WorkloadModel.sharing``, None in the paper's model): a root
conversation's requests may start with a shared prefix (system prompt, tool definitions: named
segments of full blocks, chosen by weight), and a conversation may spawn branches, conversations
of their own whose turn 1 continues the parent's turn k (agentic fan-out). Turn j then carries
``R_j = B + sum_{l<=j} Z_l`` blocks, ``B`` the inherited blocks (the prefix's, or the parent's
turn-k blocks less its partly filled last one), and the events carry ``block_hashes``: chain
hashes (``kvcast.lab.workload.block_ids``), ``len(block_hashes) == R_j``, the last block of each
request its own.

Everything is drawn from seeded ``numpy.random.Generator``s: the same model, parameters and seed
give the same trace. The conversations' own draws use the seed's main stream exactly as without
sharing; prefix choices and branches use streams of their own, so removing sharing from a model
leaves its root conversations' turns, sizes and times as they are.

The model's types are in ``kvcast.lab.workload.model``, the trace drawn in
``kvcast.lab.workload.trace``; this module draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcast.lab.workload import block_ids as bid
from kvcast.lab.workload.model import DrawOptions, Sharing, WorkloadModel, row_delays
from kvcast.lab.workload.trace import Lineage, Trace

_LOGNORMAL = 1  # delay kind code in the sampling tables (0: exponential)


def sum_before(values: NDArray, starts: NDArray, conv_row: NDArray) -> NDArray:
    """Exclusive cumulative sum of ``values`` within each conversation's rows (rows in
    conversation order; ``starts`` each conversation's first row, ``conv_row`` each row's
    conversation)."""
    excl = np.cumsum(values) - values
    return excl - excl[starts][conv_row]


def arrival_rank(first_s: NDArray[np.float64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Conversations renumbered in the order of their first requests' times ``first_s`` (s),
    ties kept in index order: ``rank[c]`` is conversation ``c``'s new number and ``inv`` its
    inverse (``inv[rank[c]] == c``), to reorder per-conversation arrays."""
    rank = np.empty(first_s.size, np.int64)
    rank[np.argsort(first_s, kind="stable")] = np.arange(first_s.size)
    return rank, np.argsort(rank)


@dataclass(frozen=True)
class _Tables:
    """Per (intent, turn - 1) sampling parameters of a model."""

    cont: NDArray[np.float64]
    zmean: NDArray[np.float64]
    zgeo: NDArray[np.bool_]
    dkind: NDArray[np.int64]
    da: NDArray[np.float64]
    db: NDArray[np.float64]
    out_mean: NDArray[np.float64]

    @classmethod
    def of(cls, model: WorkloadModel) -> _Tables:
        kinds = len(model.intents)
        max_t = max(m.max_turns for m in model.intents)
        cont = np.zeros((kinds, max_t))
        zmean = np.ones((kinds, max_t))
        zgeo = np.zeros(kinds, dtype=bool)
        dkind = np.zeros((kinds, max_t), np.int64)
        da, db = np.ones((kinds, max_t)), np.ones((kinds, max_t))
        for k, m in enumerate(model.intents):
            cont[k, : m.max_turns] = m.continuation()
            zmean[k, : m.max_turns] = m.block_means()
            zgeo[k] = m.block_law == "geometric"
            for t in range(1, m.max_turns + 1):
                d = m.delay_at(t)
                dkind[k, t - 1], da[k, t - 1], db[k, t - 1] = (d.kind == "lognormal"), d.a, d.b
        out_mean = np.array([m.output_mean for m in model.intents])
        return cls(cont, zmean, zgeo, dkind, da, db, out_mean)


def row_layout(
    turns: NDArray[np.int64],
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Rows of conversations with ``turns`` requests each, in conversation order: each
    conversation's first row, each row's conversation and each row's turn (from 1)."""
    starts = (np.cumsum(turns) - turns).astype(np.int64)
    conv_row = np.repeat(np.arange(turns.size, dtype=np.int64), turns)
    turn_row = np.arange(int(turns.sum()), dtype=np.int64) - starts[conv_row] + 1
    return starts, conv_row, turn_row


@dataclass(frozen=True)
class Rows:
    """A batch of conversations' requests, rows in conversation order (what every model
    draws): ``turns`` per conversation; per row its conversation, turn (from 1), ``offset``
    (s since the conversation's first request), output tokens and prompt choice."""

    turns: NDArray[np.int64]
    conv_row: NDArray[np.int64]
    turn_row: NDArray[np.int64]
    offset: NDArray[np.float64]
    output: NDArray[np.int64]
    choice: NDArray[np.int64] | None


@dataclass(frozen=True)
class _Rows(Rows):
    """The paper model's rows: ``own`` = own blocks ``sum_{l<=j} Z_l``; ``fill`` = tokens in
    the last block (1..block_size)."""

    own: NDArray[np.int64]
    fill: NDArray[np.int64]


def _draw_rows(
    rng: np.random.Generator, tab: _Tables, intent: NDArray, block_size: int, prompts: bool
) -> _Rows:
    """Turn counts, block increments, delays and token counts of conversations of ``intent``
    (the draws, in this order, are the paper-model generator's: do not reorder them)."""
    n = intent.size
    max_t = tab.cont.shape[1]
    # Turn counts: every alive conversation flips its continuation coin after turn t.
    turns = np.ones(n, np.int64)
    alive = np.arange(n)
    for t in range(1, max_t):
        if alive.size == 0:
            break
        alive = alive[rng.random(alive.size) < tab.cont[intent[alive], t - 1]]
        turns[alive] += 1

    rows = int(turns.sum())
    starts, conv_row, turn_row = row_layout(turns)
    ir, ti = intent[conv_row], turn_row - 1

    mean_z = tab.zmean[ir, ti]
    geo = tab.zgeo[ir]
    z = np.empty(rows, np.int64)
    z[~geo] = 1 + rng.poisson(mean_z[~geo] - 1.0)
    z[geo] = rng.geometric(1.0 / mean_z[geo])
    own = sum_before(z, starts, conv_row) + z

    expo = rng.standard_exponential(rows)
    norm = rng.standard_normal(rows)
    w = row_delays(tab.dkind[ir, ti] == _LOGNORMAL, tab.da[ir, ti], tab.db[ir, ti], expo, norm)
    w[turn_row == turns[conv_row]] = 0.0  # no delay after the last turn
    offset = sum_before(w, starts, conv_row)

    fill = rng.integers(1, block_size + 1, rows)
    output = rng.geometric(1.0 / tab.out_mean[ir]).astype(np.int64)
    choice = rng.integers(0, 1 << 30, rows) if prompts else None
    return _Rows(turns, conv_row, turn_row, offset, output, choice, own, fill)


def _concat(a: NDArray | None, b: NDArray | None) -> NDArray | None:
    return None if a is None or b is None else np.concatenate((a, b))


def generate(
    model: WorkloadModel,
    *,
    lambda0: float,
    duration_s: float | None = None,
    conversations: int | None = None,
    seed: int = 0,
    block_size: int | None = None,
    prompts: bool = False,
    cached_capacity_blocks: int | None = None,
    start_time: float = 0.0,
    session_prefix: str = "c",
    block_hashes: bool | None = None,
) -> Trace:
    """Draw a trace: conversations arrive over ``[start_time, start_time + duration_s)`` (a
    Poisson count) or are ``conversations`` many (Poisson arrivals); every turn of each is kept,
    so the last events fall after the arrival window. ``cached_tokens`` (when
    ``cached_capacity_blocks`` is given) = hit blocks of Algorithm 1 at that capacity times
    ``block_size``, capped at ``input_tokens``.

    With ``model.sharing``, ``lambda0``/``conversations`` count the root conversations; branches
    come on top. ``block_hashes`` (None: when the model shares) adds the events' block ids;
    without them a consumer sees every conversation's content as its own.

    ``block_size`` (tokens; None: 16, or an agent model's own, 1024). An agent model
    (``model.agent``) draws its conversations from ``kvcast.lab.workload.agent``; its
    ``cached_tokens`` are block-level LRU's hits (its compactions are no growing chain)."""
    if block_size is None:
        block_size = model.agent.block_size if model.agent is not None else 16
    if not lambda0 > 0 or block_size < 1:
        raise ValueError("lambda0 must be > 0 and block_size >= 1")
    if (duration_s is None) == (conversations is None):
        raise ValueError("give exactly one of duration_s and conversations")
    rng = np.random.default_rng(seed)
    if duration_s is not None:
        n = int(rng.poisson(lambda0 * duration_s))
        arrival = np.sort(rng.uniform(0.0, duration_s, n))
    else:
        n = int(conversations)  # type: ignore[arg-type]
        arrival = np.cumsum(rng.exponential(1.0 / lambda0, n))
        arrival -= arrival[0] if n else 0.0
    arrival += start_time
    if model.agent is not None:
        options = DrawOptions(
            seed=seed,
            block_size=block_size,
            prompts=prompts,
            session_prefix=session_prefix,
            block_hashes=True if block_hashes is None else block_hashes,
            meta={"lambda0": lambda0, "seed": seed, "duration_s": duration_s},
        )
        trace = model.agent.draw(rng, arrival, options)
        return _with_cached(trace, cached_capacity_blocks, block_level=True)
    kinds = len(model.intents)
    intent = rng.choice(kinds, size=n, p=model.shares) if kinds > 1 else np.zeros(n, np.int64)
    tab = _Tables.of(model)
    roots = _draw_rows(rng, tab, intent, block_size, prompts)
    sharing = model.sharing
    base = np.zeros(n, np.int64)
    prefix = np.full(n, -1, np.int64)
    if sharing is not None and sharing.prefixes:
        # A stream of its own: the conversations' draws above stay those of the plain model.
        pick = np.random.default_rng([seed, 1])
        prefix = pick.choice(len(sharing.prefixes), size=n, p=sharing.shares).astype(np.int64)
        base = np.asarray([p.blocks for p in sharing.prefixes], np.int64)[prefix]

    conv_row, turn_row = roots.conv_row, roots.turn_row
    ts = arrival[conv_row] + roots.offset
    blocks = base[conv_row] + roots.own
    fill, output, choice = roots.fill, roots.output, roots.choice
    conv_intent = intent
    parent = np.full(n, -1, np.int64)
    parent_turn = np.zeros(n, np.int64)
    total = n
    if sharing is not None and sharing.branching is not None and n:
        # Branches: drawn from a third stream after the roots, appended as conversations
        # n, n + 1, ... and then renumbered with the roots in arrival order.
        br = sharing.branching
        fork = np.random.default_rng([seed, 2])
        parents = np.flatnonzero(fork.random(n) < br.p_parent)
        turns_p = roots.turns[parents]
        k = 1 + np.minimum((fork.random(parents.size) * turns_p).astype(np.int64), turns_p - 1)
        count = 1 + fork.poisson(br.mean_branches - 1.0, parents.size)
        b_parent, b_turn = np.repeat(parents, count), np.repeat(k, count)
        starts = np.cumsum(roots.turns) - roots.turns
        at = starts[b_parent] + b_turn - 1  # the parent's row the branch continues
        b_base = blocks[at] - 1
        b_intent = intent[b_parent]
        b_rows = _draw_rows(fork, tab, b_intent, block_size, prompts)
        b_arrival = ts[at] + br.delay.sample(fork, b_parent.size)
        m = b_parent.size
        conv_row = np.concatenate((conv_row, n + b_rows.conv_row))
        turn_row = np.concatenate((turn_row, b_rows.turn_row))
        ts = np.concatenate((ts, b_arrival[b_rows.conv_row] + b_rows.offset))
        blocks = np.concatenate((blocks, b_base[b_rows.conv_row] + b_rows.own))
        fill = np.concatenate((fill, b_rows.fill))
        output = np.concatenate((output, b_rows.output))
        choice = _concat(choice, b_rows.choice)
        conv_intent = np.concatenate((intent, b_intent))
        base = np.concatenate((base, b_base))
        prefix = np.concatenate((prefix, np.full(m, -1, np.int64)))
        parent = np.concatenate((parent, b_parent))
        parent_turn = np.concatenate((parent_turn, b_turn))
        total = n + m
        # Number conversations in arrival order again (roots arrive in order already).
        rank, inv = arrival_rank(np.concatenate((arrival, b_arrival)))
        conv_row = rank[conv_row]
        conv_intent, base, prefix = conv_intent[inv], base[inv], prefix[inv]
        parent = np.where(parent >= 0, rank[np.maximum(parent, 0)], -1)[inv]
        parent_turn = parent_turn[inv]

    ir = conv_intent[conv_row]
    input_tokens = (blocks - 1) * block_size + fill

    order = np.argsort(ts, kind="stable")
    ids = None
    if (sharing is not None) if block_hashes is None else block_hashes:
        ids = _block_ids(sharing, seed, total, conv_row[order], blocks[order], base, prefix, parent)
    trace = Trace(
        conversation=conv_row[order],
        turn=turn_row[order],
        timestamp=ts[order],
        input_tokens=input_tokens[order],
        output_tokens=output[order],
        blocks=blocks[order],
        intent=ir[order].astype(np.int64),
        intent_names=tuple(m.name for m in model.intents),
        block_size=block_size,
        conversations=total,
        session_prefix=session_prefix,
        prompt_choice=None if choice is None else choice[order],
        meta={"lambda0": lambda0, "seed": seed, "duration_s": duration_s},
        block_ids=ids,
        lineage=None if sharing is None else Lineage(prefix, parent, parent_turn, base),
    )
    return _with_cached(trace, cached_capacity_blocks, block_level=False)


def _with_cached(trace: Trace, capacity_blocks: int | None, *, block_level: bool) -> Trace:
    """``trace`` with ``cached_tokens`` = LRU's hit blocks at ``capacity_blocks`` times the
    block size, capped at ``input_tokens``: Algorithm 1, or block-level LRU on the trace's
    block ids (``block_level``)."""
    if capacity_blocks is None:
        return trace
    if block_level:
        from kvcast.lab.sim.block_policies import lru_block

        hits = lru_block(trace.sim_trace(), capacity_blocks)
    else:
        from kvcast.lab.sim.lru import lru_conversation_hits

        hits = lru_conversation_hits(trace.conversation, trace.blocks, capacity_blocks)
    cached = np.minimum(hits * trace.block_size, trace.input_tokens)
    return Trace(**{**trace.__dict__, "cached_tokens": cached})


def _block_ids(
    sharing: Sharing | None,
    seed: int,
    total: int,
    conversation: NDArray[np.int64],
    blocks: NDArray[np.int64],
    base: NDArray[np.int64],
    prefix: NDArray[np.int64],
    parent: NDArray[np.int64],
) -> bid.BlockIds:
    """Chain hashes of every conversation's full blocks and every request's tail.

    ``conversation``/``blocks`` per request in trace order; ``base``, ``prefix`` and ``parent``
    per conversation (see :class:`Lineage`). A conversation's chain is its
    inherited blocks (its prefix's, or its parent's first ``base`` blocks) and then its own, up
    to its last request's ``R - 1`` full blocks."""
    key = bid.trace_key(seed)
    length = np.zeros(total, np.int64)
    np.maximum.at(length, conversation, blocks - 1)
    start = (np.cumsum(length) - length).astype(np.int64)
    chain = np.zeros(int(length.sum()), np.uint64)
    convs = np.arange(total, dtype=np.int64)
    if sharing is not None and sharing.prefixes:
        for k, p in enumerate(sharing.prefixes):
            if not p.blocks:
                continue
            seg = bid.segment_chain(key, [(s.name, s.blocks) for s in p.segments])
            for c in np.flatnonzero(prefix == k).tolist():
                chain[start[c] : start[c] + p.blocks] = seg
    roots = convs[parent < 0]
    bid.fill_own(chain, start[roots], base[roots], length[roots], roots, key)
    branches = convs[parent >= 0]
    if branches.size:
        # A branch copies its parent's first ``base`` blocks (the parents are roots, complete).
        nb = base[branches]
        within = np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb)
        dst = np.repeat(start[branches], nb) + within
        src = np.repeat(start[parent[branches]], nb) + within
        chain[dst] = chain[src]
        bid.fill_own(chain, start[branches], nb, length[branches], branches, key)
    tail = bid.tails(chain, start[conversation], blocks, np.arange(blocks.size), key)
    return bid.BlockIds(bid.public(chain), start, bid.public(tail))


def unbounded_hit_ratio(trace: Trace) -> float:
    """Block-level hit ratio of an unbounded prefix cache over the whole trace: the share of
    input blocks whose id an earlier request already had (chain ids: a prefix match)."""
    hashes = trace.block_hashes()
    if not hashes:
        return 0.0
    seen: set[int] = set()
    hit = 0
    for ids in hashes:
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hit += k
        seen.update(ids[k:])
    return hit / int(trace.blocks.sum())
