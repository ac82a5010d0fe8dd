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
leaves its root conversations' turns, sizes and times as they are. No file I/O here:
``Trace.jsonl_lines()`` yields bytes to write.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import orjson
from numpy.typing import NDArray

from kvcast.lab.workload import block_ids as bid
from kvcast.lab.workload.prompts import prompt_text
from kvcast.stats.delays import Exponential, LogNormal

if TYPE_CHECKING:
    from kvcast.lab.sim.trace import SimTrace

_LOGNORMAL = 1  # delay kind code in the sampling tables (0: exponential)


@dataclass(frozen=True)
class Delay:
    """Inter-turn delay law of a model, seconds: ``exp`` (``a`` = mean) or ``lognormal``
    (``a`` = mu, ``b`` = sigma of log seconds). The law itself (checks, CDF, density, mean,
    median) is ``kvcast.stats.delays``' (:meth:`distribution`); this adds scaling and draws."""

    kind: str
    a: float
    b: float = 0.0
    _law: Exponential | LogNormal = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("exp", "lognormal"):
            raise ValueError(f"delay kind must be exp or lognormal, got {self.kind!r}")
        law = Exponential(self.a) if self.kind == "exp" else LogNormal(self.a, self.b)
        object.__setattr__(self, "_law", law)  # frozen: set once, here

    @classmethod
    def exp(cls, mean_s: float) -> Delay:
        return cls("exp", float(mean_s))

    @classmethod
    def lognormal(cls, mu: float, sigma: float) -> Delay:
        return cls("lognormal", float(mu), float(sigma))

    def scaled(self, factor: float) -> Delay:
        """The same law with every delay multiplied by ``factor``."""
        if self.kind == "exp":
            return Delay("exp", self.a * factor)
        return Delay("lognormal", self.a + math.log(factor), self.b)

    @property
    def median_s(self) -> float:
        return self._law.median

    @property
    def mean_s(self) -> float:
        return self._law.mean

    def distribution(self) -> Exponential | LogNormal:
        """The law as a ``kvcast.stats.delays`` distribution (what the forecast takes)."""
        return self._law

    def cdf(self, x: NDArray[np.float64] | float) -> NDArray[np.float64]:
        return self._law.cdf(x)

    def pdf(self, x: float) -> float:
        return float(self._law.pdf(x))

    def sample(self, rng: np.random.Generator, size: int) -> NDArray[np.float64]:
        """``size`` delays (s) from one standard stream of ``rng`` (exponential or normal)."""
        if self.kind == "exp":
            return self.a * rng.standard_exponential(size)
        return np.exp(self.a + self.b * rng.standard_normal(size))


def row_delays(
    lognormal: NDArray[np.bool_],
    a: NDArray[np.float64],
    b: NDArray[np.float64],
    expo: NDArray[np.float64],
    norm: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Delays (s) of rows with their own laws, from standard exponential and normal draws:
    ``a * expo`` (``a`` the mean), or ``exp(a + b * norm)`` where ``lognormal``."""
    w = a * expo
    w[lognormal] = np.exp(a[lognormal] + b[lognormal] * norm[lognormal])
    return w


@dataclass(frozen=True)
class IntentModel:
    """One intent's conversations.

    ``p_continue``: P(turn t+1 | turn t), one float (geometric turn count) or a tuple indexed by
    t-1 whose last value repeats; ``max_turns`` caps M. ``delay``: law of W_t (delay after turn t),
    one law or a tuple indexed by t-1 (last repeats), times ``delay_growth ** (t-1)``.
    ``block_mean``: E[Z_j] in blocks (``first_block_mean`` for Z_1 when given); ``block_law``
    ``poisson`` (Z = 1 + Poisson(mean-1)) or ``geometric`` (Z ~ Geometric(1/mean) on 1, 2, ...).
    ``output_mean``: mean output tokens (geometric on 1, 2, ...).
    """

    name: str
    p_continue: float | tuple[float, ...] = 0.78
    delay: Delay | tuple[Delay, ...] = Delay("exp", 135.0)
    delay_growth: float = 1.0
    block_mean: float = 3.0
    first_block_mean: float | None = None
    block_law: str = "poisson"
    output_mean: float = 250.0
    max_turns: int = 64

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if self.block_law not in ("poisson", "geometric"):
            raise ValueError(f"block_law must be poisson or geometric, got {self.block_law!r}")
        if min(self.block_mean, self.first_block_mean or 1.0, self.output_mean) < 1.0:
            raise ValueError("block and output means must be >= 1")
        if not all(0.0 <= p <= 1.0 for p in np.atleast_1d(self.p_continue)):
            raise ValueError("continuation probabilities must lie in [0, 1]")

    def continuation(self) -> NDArray[np.float64]:
        """P(M >= t+1 | M >= t) for t = 1..max_turns (the last is 0: the cap)."""
        p = np.atleast_1d(np.asarray(self.p_continue, dtype=np.float64))
        idx = np.minimum(np.arange(self.max_turns), p.size - 1)
        out = p[idx].copy()
        out[-1] = 0.0
        return out

    def delay_at(self, turn: int) -> Delay:
        """Law of W_t, the delay between turn ``turn`` and turn ``turn + 1``."""
        laws = self.delay if isinstance(self.delay, tuple) else (self.delay,)
        law = laws[min(turn, len(laws)) - 1]
        return law if self.delay_growth == 1.0 else law.scaled(self.delay_growth ** (turn - 1))

    def block_means(self) -> NDArray[np.float64]:
        """E[Z_t] for t = 1..max_turns, blocks."""
        z = np.full(self.max_turns, float(self.block_mean))
        if self.first_block_mean is not None:
            z[0] = self.first_block_mean
        return z


@dataclass(frozen=True)
class Segment:
    """A run of shared content, ``blocks`` full KV blocks; the same name is the same content."""

    name: str
    blocks: int

    def __post_init__(self) -> None:
        if self.blocks < 1:
            raise ValueError("a segment has at least one block")


@dataclass(frozen=True)
class SharedPrefix:
    """What a root conversation's every request starts with: ``segments`` in order (none: no
    shared prefix), chosen for a conversation with probability proportional to ``weight``.
    Prefixes that start with the same segments share those blocks (nesting)."""

    segments: tuple[Segment, ...]
    weight: float

    @property
    def blocks(self) -> int:
        """Length of the prefix, KV blocks."""
        return sum(s.blocks for s in self.segments)


@dataclass(frozen=True)
class Branching:
    """Agentic branching: a root conversation becomes a parent with probability ``p_parent``;
    it then spawns ``1 + Poisson(mean_branches - 1)`` branches from one of its turns k (uniform
    over its turns). Each branch is a conversation of the parent's intent, with its own turns
    drawn from that intent's laws; its turn 1 arrives ``delay`` (seconds) after the parent's
    turn k and starts with the parent's turn-k input less its partly filled last block."""

    p_parent: float
    mean_branches: float = 3.0
    delay: Delay = Delay("exp", 10.0)

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_parent <= 1.0 or self.mean_branches < 1.0:
            raise ValueError("p_parent must lie in [0, 1] and mean_branches be >= 1")


@dataclass(frozen=True)
class Sharing:
    """Cross-conversation sharing of a workload: shared prefixes of the root conversations
    (none: every conversation's content is its own) and agentic branching (None: no branches)."""

    prefixes: tuple[SharedPrefix, ...] = ()
    branching: Branching | None = None

    def __post_init__(self) -> None:
        if self.prefixes:
            weights = [p.weight for p in self.prefixes]
            if min(weights) < 0 or sum(weights) <= 0:
                raise ValueError("prefix weights must be >= 0 with a positive sum")
        sizes: dict[str, int] = {}
        for seg in (s for p in self.prefixes for s in p.segments):
            if sizes.setdefault(seg.name, seg.blocks) != seg.blocks:
                raise ValueError(f"segment {seg.name!r} has two sizes")

    @property
    def shares(self) -> NDArray[np.float64]:
        """Probability of each prefix for a root conversation."""
        w = np.asarray([p.weight for p in self.prefixes], dtype=np.float64)
        return w / w.sum()


@dataclass(frozen=True)
class DrawOptions:
    """What :func:`generate` passes a :class:`ConversationModel` besides its random stream:
    the seed (the model's other streams derive from it), ``block_size`` (tokens), whether to
    add prompt choices and block ids, the session-id prefix and the trace's ``meta``."""

    seed: int
    block_size: int
    prompts: bool
    session_prefix: str
    block_hashes: bool
    meta: dict[str, object]


class ConversationModel(Protocol):
    """A model that draws its conversations itself (``kvcast.lab.workload.agent.AgentModel``;
    it depends on this module, not the other way round): ``block_size`` is its default."""

    block_size: int

    def draw(
        self, rng: np.random.Generator, arrival: NDArray[np.float64], options: DrawOptions
    ) -> Trace:
        """The trace of conversations arriving at ``arrival`` (s); ``rng`` is the seed's main
        stream after the arrivals were drawn."""
        ...


@dataclass(frozen=True)
class WorkloadModel:
    """A mix of intents: ``weights[k]`` is the share of conversations of ``intents[k]``;
    ``sharing`` adds shared prefixes and branches (see the module doc). ``agent``: the
    conversations are coding agents' instead (``kvcast.lab.workload.agent``; the intents then
    only name its responses' endings, and ``sharing`` is unused)."""

    intents: tuple[IntentModel, ...]
    weights: tuple[float, ...]
    sharing: Sharing | None = None
    agent: ConversationModel | None = None

    def __post_init__(self) -> None:
        if not self.intents or len(self.intents) != len(self.weights):
            raise ValueError("need one weight per intent and at least one intent")
        if min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError("weights must be >= 0 with a positive sum")
        if len({m.name for m in self.intents}) != len(self.intents):
            raise ValueError("intent names must be unique")

    @classmethod
    def from_mix(cls, mix: Mapping[str, tuple[IntentModel, float]]) -> WorkloadModel:
        return cls(tuple(m for m, _ in mix.values()), tuple(w for _, w in mix.values()))

    @property
    def shares(self) -> NDArray[np.float64]:
        w = np.asarray(self.weights, dtype=np.float64)
        return w / w.sum()


@dataclass(frozen=True)
class IntentTruth:
    """Ground truth of one intent, arrays indexed by t-1 for t = 1..max_turns.

    ``reach[t-1] = S_t = P(M >= t)``; ``p_continue[t-1] = P(M >= t+1 | M >= t)``;
    ``median_delay_s[t-1]`` = median of W_t; ``mean_blocks[t-1] = E[R_t]``. Moments in blocks
    per conversation: ``A_R = E sum_j R_j``, ``A_H = E sum_{j<M} R_j``,
    ``A_H_hash = E sum_{j<M} (R_j - 1)``, ``E_B = E R_M``, ``E_M = E M``.
    """

    intent: str
    share: float
    reach: NDArray[np.float64]
    p_continue: NDArray[np.float64]
    median_delay_s: NDArray[np.float64]
    mean_blocks: NDArray[np.float64]
    delays: tuple[Delay, ...]
    A_R: float
    A_H: float
    A_H_hash: float
    E_B: float
    E_M: float

    def delay_cdf(self, x: NDArray[np.float64] | float) -> NDArray[np.float64]:
        """CDF of a delay drawn at random among this intent's delays (weights S_{t+1})."""
        w = self.reach[1:]
        total = np.zeros_like(np.asarray(x, dtype=np.float64))
        for wt, law in zip(w, self.delays[:-1], strict=True):
            if wt > 0:
                total = total + wt * law.cdf(x)
        return total / w.sum() if w.sum() > 0 else total


def ground_truth(model: WorkloadModel) -> dict[str, IntentTruth]:
    """Exact per-intent, per-turn parameters of ``model`` (no sampling)."""
    if model.agent is not None:
        raise ValueError("an agent model has no per-intent ground truth: measure its trace")
    out: dict[str, IntentTruth] = {}
    for m, share in zip(model.intents, model.shares, strict=True):
        p = m.continuation()
        reach = np.concatenate(([1.0], np.cumprod(p[:-1])))
        mean_r = np.cumsum(m.block_means())
        stop = reach * (1.0 - p)  # P(M = t)
        delays = tuple(m.delay_at(t) for t in range(1, m.max_turns + 1))
        a_h = float(np.sum(reach[1:] * mean_r[:-1]))
        out[m.name] = IntentTruth(
            intent=m.name,
            share=float(share),
            reach=reach,
            p_continue=p,
            median_delay_s=np.array([d.median_s for d in delays]),
            mean_blocks=mean_r,
            delays=delays,
            A_R=float(np.sum(reach * mean_r)),
            A_H=a_h,
            A_H_hash=a_h - float(np.sum(reach[1:])),
            E_B=float(np.sum(stop * mean_r)),
            E_M=float(np.sum(reach)),
        )
    return out


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
