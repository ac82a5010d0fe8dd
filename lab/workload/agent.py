"""Coding-agent conversations: the ``agent`` preset's model, sizes in tokens, times in seconds.

An agent conversation is a loop of requests whose context grows turn by turn. Every
conversation (a *root*) opens with the same system-plus-tools prefix of ``prefix_tokens``
(shared by all conversations: a :class:`~kvcast.lab.workload.model.SharedPrefix`), then:

1. **Requests per conversation** ``M`` follow a :class:`TurnLaw`: given by its quartiles
   (log-linear between them) and a Pareto tail above the upper one, capped.
2. **Context.** Request 1 holds the prefix and a first message (``first_message`` tokens);
   request ``j + 1`` holds request ``j``'s tokens times ``1 + g``, ``g`` drawn from ``growth``
   (the fraction a turn adds: the response and the tool's result), so request ``j``'s share in
   request ``j + 1`` is ``1 / (1 + g)`` on every turn. A conversation draws a context window
   from ``windows``; a request that would pass it is **compacted** instead: the prefix and a
   summary (``summary`` tokens) start a new chain of content, which no earlier request shares.
3. **How each response ends** (:class:`Ending`: a tool call, the end of the turn, the length
   limit...), drawn per request from the endings' shares: the request's event carries the
   ending's ``intent``, its ``output_tokens`` are geometric of the ending's mean, and the next
   request comes ``response_s`` plus a draw of the ending's ``delay`` later (a machine answers a
   tool call in seconds, a person answers the end of a turn in minutes).
4. **Sub-agents.** A root spawns sub-agents with probability ``subagent_share``, one of
   ``subagent_counts`` of them, from one of its requests ``k`` (uniform over its requests): each
   a conversation of its own (own session) arriving ``subagent_delay`` after request ``k``, whose
   first request is request ``k``'s input less its partly filled last block plus a task message
   (``subagent_task`` tokens), with ``subagent_turns`` requests and the same growth, endings and
   windows.

Conversations arrive as a Poisson process (stationary), as in the paper's model. The parameters
of the preset (``kvcast.lab.workload.presets.agent``) and where each comes from: docs/workloads.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcast.lab.workload import generator as gen
from kvcast.lab.workload.model import Delay, DrawOptions, Segment, SharedPrefix, Sharing
from kvcast.lab.workload.trace import Lineage, Trace


@dataclass(frozen=True)
class LogNormalSize:
    """A log-normal law of a positive size: ``median`` (its unit: tokens, or a fraction) and
    ``sigma`` (of the log)."""

    median: float
    sigma: float

    def __post_init__(self) -> None:
        if not self.median > 0 or self.sigma < 0:
            raise ValueError("a log-normal size needs median > 0 and sigma >= 0")

    def draw(self, rng: np.random.Generator, size: int) -> NDArray[np.float64]:
        return self.median * np.exp(self.sigma * rng.standard_normal(size))


@dataclass(frozen=True)
class TurnLaw:
    """Law of the number of requests ``M`` of a conversation, given by quantiles.

    ``knots``: ``(u, m)`` pairs, ``u`` increasing in (0, 1), ``m`` increasing and >= 1: the
    quantile function ``Q`` is log-linear between ``(0, 1)`` and the knots, and above the last
    knot ``(u_k, m_k)`` a Pareto tail ``Q(u) = m_k ((1 - u_k) / (1 - u)) ** (1 / tail_alpha)``;
    ``M = min(ceil(Q(U)), max_turns)``, so ``P(M <= m) = u`` at every knot whose ``m`` is an
    integer."""

    knots: tuple[tuple[float, float], ...]
    tail_alpha: float
    max_turns: int

    def __post_init__(self) -> None:
        us = [u for u, _ in self.knots]
        ms = [m for _, m in self.knots]
        if not self.knots or not all(0 < u < 1 for u in us) or us != sorted(set(us)):
            raise ValueError("turn-law knots need increasing quantile levels in (0, 1)")
        if ms[0] < 1 or ms != sorted(set(ms)):
            raise ValueError("turn-law knot values must increase from >= 1")
        if not self.tail_alpha > 0 or self.max_turns < ms[-1]:
            raise ValueError("tail_alpha must be > 0 and max_turns >= the last knot")

    def quantile(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        """``Q(u)`` for ``u`` in [0, 1) (requests, not yet rounded)."""
        u = np.asarray(u, dtype=np.float64)
        lv = np.array([0.0] + [k for k, _ in self.knots])
        lm = np.log(np.array([1.0] + [m for _, m in self.knots]))
        u_k, m_k = self.knots[-1]
        with np.errstate(divide="ignore"):
            tail = m_k * ((1.0 - u_k) / (1.0 - u)) ** (1.0 / self.tail_alpha)
        return np.where(u <= u_k, np.exp(np.interp(u, lv, lm)), tail)

    def draw(self, rng: np.random.Generator, size: int) -> NDArray[np.int64]:
        q = np.ceil(self.quantile(rng.random(size)))
        return np.clip(q, 1, self.max_turns).astype(np.int64)

    def survival(self) -> NDArray[np.float64]:
        """``P(M >= t)`` for t = 1..max_turns."""
        t = np.arange(1, self.max_turns + 1, dtype=np.float64)
        return 1.0 - self.cdf(t - 1.0)

    def cdf(self, m: NDArray[np.float64]) -> NDArray[np.float64]:
        """``P(M <= m)`` for integers ``m`` (0 below 1, 1 from ``max_turns``)."""
        m = np.asarray(m, dtype=np.float64)
        lv = np.array([0.0] + [k for k, _ in self.knots])
        lm = np.log(np.array([1.0] + [v for _, v in self.knots]))
        u_k, m_k = self.knots[-1]
        with np.errstate(divide="ignore"):
            body = np.interp(np.log(np.maximum(m, 1.0)), lm, lv)
            tail = 1.0 - (1.0 - u_k) * (m_k / np.maximum(m, m_k)) ** self.tail_alpha
        out = np.where(m <= m_k, body, tail)
        out = np.where(m < 1, 0.0, out)
        return np.where(m >= self.max_turns, 1.0, out)

    @property
    def mean(self) -> float:
        """E[M], requests."""
        return float(self.survival().sum())


@dataclass(frozen=True)
class Ending:
    """One way a response ends: ``share`` of responses; the request's event carries
    ``intent``; ``output_mean`` (tokens, geometric); the next request follows after the
    model's ``response_s`` plus a draw of ``delay`` (seconds)."""

    intent: str
    share: float
    delay: Delay
    output_mean: float

    def __post_init__(self) -> None:
        if self.share < 0 or self.output_mean < 1:
            raise ValueError("an ending needs share >= 0 and output_mean >= 1")


@dataclass(frozen=True)
class AgentModel:
    """The agent workload's parameters (see the module doc; tokens, seconds)."""

    turns: TurnLaw
    endings: tuple[Ending, ...]
    response_s: float
    prefix_tokens: int
    first_message: LogNormalSize
    growth: LogNormalSize
    windows: tuple[tuple[int, float], ...]
    summary: LogNormalSize
    subagent_share: float
    subagent_counts: tuple[int, ...]
    subagent_delay: Delay
    subagent_task: LogNormalSize
    subagent_turns: TurnLaw
    prefix_name: str = "agent-system-tools"
    block_size: int = 1024
    """Tokens per KV block when ``generate`` is given none (the sizes are in tokens)."""

    def __post_init__(self) -> None:
        shares = [e.share for e in self.endings]
        if not self.endings or sum(shares) <= 0:
            raise ValueError("an agent model needs endings with a positive share")
        if len({e.intent for e in self.endings}) != len(self.endings):
            raise ValueError("ending intents must be unique")
        if self.response_s < 0 or self.prefix_tokens < 0 or self.block_size < 1:
            raise ValueError("response_s and prefix_tokens must be >= 0, block_size >= 1")
        if not self.windows or min(w for _, w in self.windows) < 0:
            raise ValueError("windows need (tokens, weight) pairs with weights >= 0")
        if min(t for t, _ in self.windows) <= self.prefix_tokens:
            raise ValueError("every context window must exceed the prefix")
        if not 0 <= self.subagent_share <= 1 or min(self.subagent_counts, default=0) < 1:
            raise ValueError("subagent_share must lie in [0, 1] and counts be >= 1")

    @property
    def shares(self) -> NDArray[np.float64]:
        """Probability of each ending."""
        w = np.asarray([e.share for e in self.endings], dtype=np.float64)
        return w / w.sum()

    @property
    def intent_names(self) -> tuple[str, ...]:
        return tuple(e.intent for e in self.endings)

    def draw(
        self, rng: np.random.Generator, arrival: NDArray[np.float64], options: DrawOptions
    ) -> Trace:
        """The trace (``generate`` calls this for a model whose ``agent`` is this one)."""
        return generate_agent(self, rng, arrival, options)


@dataclass(frozen=True)
class _Rows(gen.Rows):
    """An agent's rows: ``tokens`` input tokens; ``epoch`` the number of compactions before
    the row; ``ending`` its response's ending."""

    tokens: NDArray[np.int64]
    epoch: NDArray[np.int64]
    ending: NDArray[np.int64]


def _conversations(
    rng: np.random.Generator,
    am: AgentModel,
    turns: NDArray[np.int64],
    first: NDArray[np.int64],
    prompts: bool,
) -> _Rows:
    """Draw the requests of conversations with ``turns`` requests whose first request holds
    ``first`` tokens (the draws' order is part of the seed's trace: do not reorder)."""
    n = turns.size
    rows = int(turns.sum())
    starts, conv_row, turn_row = gen.row_layout(turns)
    sizes = np.asarray([t for t, _ in am.windows], dtype=np.float64)
    weights = np.asarray([w for _, w in am.windows], dtype=np.float64)
    window = sizes[rng.choice(sizes.size, size=n, p=weights / weights.sum())]
    growth = am.growth.draw(rng, rows)
    summary = am.prefix_tokens + np.ceil(am.summary.draw(rng, rows))
    tokens = np.empty(rows, np.float64)
    epoch = np.zeros(rows, np.int64)
    tokens[starts] = first
    cur = first.astype(np.float64)
    cur_epoch = np.zeros(n, np.int64)
    alive = np.arange(n)
    # Sequential in the turn (a compaction resets the context), vectorized over conversations.
    for t in range(2, int(turns.max(initial=0)) + 1):
        alive = alive[turns[alive] >= t]
        if alive.size == 0:
            break
        at = starts[alive] + t - 1
        nxt = cur[alive] + np.maximum(1.0, np.round(cur[alive] * growth[at]))
        over = nxt > window[alive]
        nxt[over] = summary[at][over]
        cur_epoch[alive[over]] += 1
        cur[alive] = nxt
        tokens[at] = nxt
        epoch[at] = cur_epoch[alive]
    ending = rng.choice(len(am.endings), size=rows, p=am.shares).astype(np.int64)
    expo = rng.standard_exponential(rows)
    norm = rng.standard_normal(rows)
    laws = [e.delay for e in am.endings]
    lognormal = np.asarray([d.kind == "lognormal" for d in laws])[ending]
    a = np.asarray([d.a for d in laws], np.float64)[ending]
    b = np.asarray([d.b for d in laws], np.float64)[ending]
    wait = gen.row_delays(lognormal, a, b, expo, norm) + am.response_s
    wait[turn_row == turns[conv_row]] = 0.0  # no wait after the last request
    offset = gen.sum_before(wait, starts, conv_row)
    out_mean = np.asarray([e.output_mean for e in am.endings], np.float64)[ending]
    output = rng.geometric(1.0 / out_mean).astype(np.int64)
    choice = rng.integers(0, 1 << 30, rows) if prompts else None
    common = (turns, conv_row, turn_row, offset, output, choice)  # gen.Rows' fields, in order
    return _Rows(*common, tokens.astype(np.int64), epoch, ending)


def generate_agent(
    am: AgentModel, rng: np.random.Generator, arrival: NDArray[np.float64], options: DrawOptions
) -> Trace:
    """The trace of roots arriving at ``arrival`` (s) and their sub-agents (see the module
    doc); ``rng`` is the seed's main stream after the arrivals were drawn."""
    bs, seed, prompts = options.block_size, options.seed, options.prompts
    n = arrival.size
    turns = am.turns.draw(rng, n)
    first = am.prefix_tokens + np.ceil(am.first_message.draw(rng, n)).astype(np.int64)
    roots = _conversations(rng, am, turns, first, prompts)
    ts = arrival[roots.conv_row] + roots.offset
    blocks = -(-roots.tokens // bs)

    # Sub-agents: a stream of their own (seed, 2), as the generator's branches.
    fork = np.random.default_rng([seed, 2])
    parents = np.flatnonzero(fork.random(n) < am.subagent_share)
    counts = np.asarray(am.subagent_counts, np.int64)
    count = counts[fork.integers(0, counts.size, parents.size)]
    tp = turns[parents]
    k = 1 + np.minimum((fork.random(parents.size) * tp).astype(np.int64), tp - 1)
    b_parent, b_turn = np.repeat(parents, count), np.repeat(k, count)
    starts = np.cumsum(turns) - turns
    at = starts[b_parent] + b_turn - 1  # the parent's request a sub-agent starts from
    m = b_parent.size
    b_base = blocks[at] - 1  # the parent's full blocks at request k
    b_first = b_base * bs + np.ceil(am.subagent_task.draw(fork, m)).astype(np.int64)
    b_turns = am.subagent_turns.draw(fork, m)
    # Drawn before the conversations, whose last draws are the optional prompt choices: a
    # trace with prompts is the same trace.
    b_arrival = ts[at] + am.response_s + am.subagent_delay.sample(fork, m)
    subs = _conversations(fork, am, b_turns, b_first, prompts)

    total = n + m
    conv_row = np.concatenate((roots.conv_row, n + subs.conv_row))
    turn_row = np.concatenate((roots.turn_row, subs.turn_row))
    ts = np.concatenate((ts, b_arrival[subs.conv_row] + subs.offset))
    tokens = np.concatenate((roots.tokens, subs.tokens))
    epoch = np.concatenate((roots.epoch, subs.epoch))
    ending = np.concatenate((roots.ending, subs.ending))
    output = np.concatenate((roots.output, subs.output))
    choice = None if roots.choice is None else np.concatenate((roots.choice, subs.choice))  # type: ignore[arg-type]
    parent = np.concatenate((np.full(n, -1, np.int64), b_parent))
    parent_turn = np.concatenate((np.zeros(n, np.int64), b_turn))
    parent_row = np.concatenate((np.full(n, -1, np.int64), at))
    # Conversations numbered in arrival order (roots arrive in order already).
    rank, inv = gen.arrival_rank(np.concatenate((arrival, b_arrival)))
    conv_row = rank[conv_row]
    parent = np.where(parent >= 0, rank[np.maximum(parent, 0)], -1)[inv]
    parent_turn, parent_row = parent_turn[inv], parent_row[inv]

    blocks = -(-tokens // bs)
    prefix_blocks = am.prefix_tokens // bs
    base = np.where(parent >= 0, blocks[np.maximum(parent_row, 0)] - 1, prefix_blocks)
    prefix = np.where((parent < 0) & (prefix_blocks > 0), 0, -1).astype(np.int64)
    order = np.argsort(ts, kind="stable")
    ids = None
    if options.block_hashes:
        ids = _ids(am, seed, bs, conv_row, epoch, blocks, order, parent, parent_row, base)
    return Trace(
        conversation=conv_row[order],
        turn=turn_row[order],
        timestamp=ts[order],
        input_tokens=tokens[order],
        output_tokens=output[order],
        blocks=blocks[order],
        intent=ending[order],
        intent_names=am.intent_names,
        block_size=bs,
        conversations=total,
        session_prefix=options.session_prefix,
        prompt_choice=None if choice is None else choice[order],
        meta={**options.meta, "compactions": int(np.count_nonzero(np.diff(epoch) > 0))},
        block_ids=ids,
        lineage=Lineage(prefix, parent, parent_turn, base),
    )


def _ids(
    am: AgentModel,
    seed: int,
    bs: int,
    conv_row: NDArray[np.int64],
    epoch: NDArray[np.int64],
    blocks: NDArray[np.int64],
    order: NDArray[np.int64],
    parent: NDArray[np.int64],
    parent_row: NDArray[np.int64],
    base: NDArray[np.int64],
) -> object:
    """Block ids with one chain per (conversation, epoch): a compaction starts a new chain
    after the shared prefix; a sub-agent's first chain continues its parent's at request k."""
    key = conv_row * (int(epoch.max(initial=0)) + 1) + epoch
    uniq, chain_row = np.unique(key, return_inverse=True)
    chain_row = chain_row.reshape(-1).astype(np.int64)
    chains = uniq.size
    chain_conv = np.empty(chains, np.int64)
    chain_conv[chain_row] = conv_row
    chain_epoch = np.empty(chains, np.int64)
    chain_epoch[chain_row] = epoch
    prefix_blocks = am.prefix_tokens // bs
    sharing = None
    c_prefix = np.full(chains, -1, np.int64)
    c_base = np.zeros(chains, np.int64)
    if prefix_blocks > 0:
        segment = Segment(am.prefix_name, prefix_blocks)
        sharing = Sharing(prefixes=(SharedPrefix((segment,), 1.0),))
        c_prefix[:] = 0
        c_base[:] = prefix_blocks
    # A sub-agent's epoch-0 chain continues the chain of its parent's request k.
    c_parent = np.full(chains, -1, np.int64)
    first_sub = (parent[chain_conv] >= 0) & (chain_epoch == 0)
    c_parent[first_sub] = chain_row[parent_row[chain_conv[first_sub]]]
    c_prefix[first_sub] = -1
    c_base[first_sub] = base[chain_conv[first_sub]]
    ids = gen._block_ids(
        sharing, seed, chains, chain_row[order], blocks[order], c_base, c_prefix, c_parent
    )
    return gen.bid.BlockIds(ids.chain, ids.start, ids.tail, chain_row[order])


def describe(am: AgentModel) -> dict[str, float]:
    """Closed-form figures of the model (for the docs' table): E[M] of roots and sub-agents,
    requests; the median share of a request in the next, ``1 / (1 + median g)``."""
    return {
        "mean_requests": am.turns.mean,
        "mean_subagent_requests": am.subagent_turns.mean,
        "median_prefix_share": 1.0 / (1.0 + am.growth.median),
        "p_subagent_parent": am.subagent_share,
        "prefix_blocks_at_1024": float(math.floor(am.prefix_tokens / 1024)),
    }
