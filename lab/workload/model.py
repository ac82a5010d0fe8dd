"""The workload model of the generator: intents (turn-count law, delays, block increments),
their mix, shared prefixes and branches, and the ground truth a model implies.

Units: delays in seconds, sizes in KV blocks (increments ``Z_j >= 1``) and tokens (outputs).
:func:`kvcast.lab.workload.generator.generate` draws a :class:`~kvcast.lab.workload.trace.Trace`
from a :class:`WorkloadModel`; the generator's module docstring states the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from kvcast.stats.delays import Exponential, LogNormal

if TYPE_CHECKING:
    from kvcast.lab.workload.trace import Trace


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
