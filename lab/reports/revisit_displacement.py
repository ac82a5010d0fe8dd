"""Where the forecast's error on a trace comes from: each revisit's realized displacement.

Block LRU is a stack algorithm (docs/validation.md, "Tiers"): the content a conversation's
previous request left is still resident at its next request as long as fewer than N blocks
were referenced since. For revisit k, with D_k the distinct blocks referenced between the two
requests (realized, one number per revisit, whatever the capacity) and v_k the blocks it
reuses of its own (in its previous request, referenced by no other conversation), its own hits
are ``min(v_k, (N - D_k)^+)`` (the head of its previous request is its most recent block). The
forecast replaces D_k by a Gaussian of mean d(W_k) and standard deviation s(W_k), from the
window's statistics alone (``kvcast.stats.finite_size``, partial residency). So comparing, per
revisit,

- the simulator's own hits with the rule at the realized D_k (equal where the stack argument
  holds: a check of this report, not of the forecast),
- the realized D_k with d(W_k) (the forecast's mean displacement), and
- the gross load between the two requests, G_k input blocks, with ``lambda_b W_k``
  (``lambda_b = lambda0 A_R``, the sample's mean input blocks per second)

says whether the forecast's error is in its mean, its spread or the cache's mechanics (with the
load and the revisits per second over each fifth of the span, to see when they came). The
last columns re-evaluate the forecast's own part with d scaled, per delay bin (powers of two
seconds), by the load the bin's revisits saw against a reference rate (``RESCALINGS``): what
the forecast would give if it knew when the revisits came, which the window's statistics do
not say (experiments, not product modes). Against the sample's mean load ``lambda_b``; against
the same divided by its mean over every revisit's gap, and against the load of the 600 s
before each revisit, two references one partition could measure without knowing its share of
the load.

``python -m kvcast.lab.reports.revisit_displacement [--trace F | --preset NAME] [--markdown
F]`` prints the tables for a Mooncake-format trace (default: the synthetic trace in
``data/traces/``) or a generated preset with block ids (as the tier validation generates it:
its warm-up and tail included, since the trace is taken whole). 2 s on the trace, a few
minutes on a preset.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from kvcast.lab.reports.tier_validation import TierGrid
from kvcast.lab.reports.workloads import (
    DEFAULT_MOONCAKE,
    ValidationWorkload,
    agent_workload,
    generated_workload,
    mooncake_workload,
)
from kvcast.lab.sim.registry import get_policy
from kvcast.lab.sim.trace import BlockHashes, SimTrace
from kvcast.lab.workload.presets import AGENT_PRESETS, SHARING_PRESETS
from kvcast.stats.estimators import shared_model
from kvcast.stats.finite_size import FluctuationModel, prefix_reused
from kvcast.stats.tiers import TIER_MODES, reach, tier_shares

CAPACITIES = (1000, 2000, 4000, 8000, 16000)  # blocks
TRAILING_S = 600.0  # the rate window's default (--rate-window)
RESCALINGS = {
    "load-scaled": "each delay bin's load against lambda_b = lambda0 A_R, the sample's mean load",
    "self-normalised": "the same divided by its mean over every revisit's gap",
    "trailing-rate": "against the input blocks per second of the 600 s before each revisit",
}


@dataclass(frozen=True)
class Revisits:
    """Per revisit k of a trace (a request whose conversation made an earlier one): ``request``
    (its index), ``delay_s`` W_k, ``own`` v_k (blocks), ``own_positions`` (where they sit in
    the request), ``displacement`` D_k and ``load`` G_k (blocks)."""

    request: NDArray[np.int64]
    delay_s: NDArray[np.float64]
    own: NDArray[np.float64]
    own_positions: tuple[NDArray[np.int64], ...]
    displacement: NDArray[np.float64]
    load: NDArray[np.float64]

    def select(self, keep: NDArray[np.bool_]) -> Revisits:
        """The revisits where ``keep`` (one flag per revisit)."""
        return Revisits(
            self.request[keep],
            self.delay_s[keep],
            self.own[keep],
            tuple(p for p, k in zip(self.own_positions, keep, strict=True) if k),
            self.displacement[keep],
            self.load[keep],
        )


def measure_revisits(trace: SimTrace) -> Revisits:
    """One pass over the trace's requests in processing order (see the module docstring)."""
    hashes = trace.block_hashes
    if not isinstance(hashes, BlockHashes):
        raise ValueError("the trace needs integer block ids for every request")
    _, dense = np.unique(hashes.ids, return_inverse=True)
    offsets = hashes.offsets
    lengths = np.diff(offsets)
    before = np.concatenate(([0], np.cumsum(lengths)))  # input blocks before request r
    last_reference = np.full(int(dense.max()) + 1 if dense.size else 0, -1, dtype=np.int64)
    owner = np.full(last_reference.size, -1, dtype=np.int64)  # first conversation; -2: shared
    # Blocks whose latest reference is request j: D_k is their sum over the requests between.
    latest = np.zeros(len(trace), dtype=np.int64)
    previous: dict[int, int] = {}
    rows: list[tuple[int, float, int, float, float]] = []
    positions: list[NDArray[np.int64]] = []
    for r in range(len(trace)):
        conversation = int(trace.conversation[r])
        ids = dense[offsets[r] : offsets[r + 1]]
        p = previous.get(conversation)
        if p is not None:
            earlier = dense[offsets[p] : offsets[p + 1]]
            common = min(ids.size, earlier.size)
            same = ids[:common] == earlier[:common]
            own = np.flatnonzero(same & (owner[ids[:common]] == conversation))
            positions.append(own)
            rows.append(
                (
                    r,
                    float(trace.timestamp[r] - trace.timestamp[p]),
                    own.size,
                    float(latest[p + 1 : r].sum()),
                    float(before[r] - before[p + 1]),
                )
            )
        seen = owner[ids]
        owner[ids] = np.where(seen == -1, conversation, np.where(seen == conversation, seen, -2))
        distinct = np.unique(ids)
        np.subtract.at(latest, last_reference[distinct][last_reference[distinct] >= 0], 1)
        latest[r] += distinct.size
        last_reference[distinct] = r
        previous[conversation] = r
    table = np.array(rows, dtype=np.float64).reshape(-1, 5)
    return Revisits(
        request=table[:, 0].astype(np.int64),
        delay_s=table[:, 1],
        own=table[:, 2],
        own_positions=tuple(positions),
        displacement=table[:, 3],
        load=table[:, 4],
    )


@dataclass(frozen=True)
class CapacityRow:
    """Own hits and the whole hit ratio at one capacity, as shares of all input blocks."""

    capacity_blocks: int
    simulated_own: float
    realized_rule_own: float
    forecast_own: float
    simulated: float
    forecast: float
    rescaled_own: dict[str, float]  # per rescaling (RESCALINGS), the forecast's own part

    def rescaled(self, name: str) -> float:
        """The forecast with its own part re-evaluated at rescaling ``name``'s displacement."""
        return self.forecast + self.rescaled_own[name] - self.forecast_own


@dataclass(frozen=True)
class DelayRow:
    lo_s: float
    hi_s: float
    revisits: int
    realized: float
    forecast: float
    realized_spread: float  # standard deviation of D_k - d(W_k) over the bin (blocks)
    forecast_spread: float  # the model's s(W_k), mean over the bin (blocks)
    load_ratio: float


@dataclass(frozen=True)
class PeriodRow:
    """One fifth of the measured span: input blocks and revisits per second."""

    start_s: float  # from the first measured request
    end_s: float
    blocks_per_s: float
    revisits_per_s: float


@dataclass(frozen=True)
class DisplacementReport:
    delays: list[DelayRow]
    capacities: list[CapacityRow]
    tier_grid: tuple[tuple[int, ...], tuple[int, ...]]  # GPU and host capacities (blocks)
    periods: list[PeriodRow]

    def at(self, capacity: float) -> CapacityRow:
        return next(c for c in self.capacities if c.capacity_blocks == capacity)

    def host_tier(self) -> list[tuple[int, int, str, float, list[float]]]:
        """Per point of the tier grid and mode: (GPU, host, mode, the host tier's simulated
        share, its errors: the forecast's, then each rescaling's), the tiers' shares read off
        the single-cache rows as the tiered forecast reads them (``tier_shares``)."""
        columns: list[Callable[[CapacityRow], float]] = [
            lambda c: c.simulated,
            lambda c: c.forecast,
            *(lambda c, n=name: c.rescaled(n) for name in RESCALINGS),
        ]

        def host_share(
            column: Callable[[CapacityRow], float], gpu: int, host: int, mode: str
        ) -> float:
            def curve(caps: Sequence[float]) -> list[float]:
                return [column(self.at(c)) for c in caps]

            return tier_shares(curve, (gpu, host), mode)[1]

        out = []
        for gpu in self.tier_grid[0]:
            for host in self.tier_grid[1]:
                for mode in TIER_MODES:
                    simulated, *others = (host_share(f, gpu, host, mode) for f in columns)
                    out.append((gpu, host, mode, simulated, [x - simulated for x in others]))
        return out

    def to_markdown(self) -> str:
        lines = [
            "| period (s) | input blocks / s | revisits / s |",
            "|---|---|---|",
            *(
                f"| {p.start_s:,.0f}-{p.end_s:,.0f} | {p.blocks_per_s:,.0f} "
                f"| {p.revisits_per_s:.2f} |"
                for p in self.periods
            ),
            "",
            "| delay (s) | revisits | realized D, mean | forecast d(W), mean | D / d "
            "| sd of D - d | forecast s(W) | load G / (lambda_b W) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        names = list(RESCALINGS)
        for d in self.delays:
            lines.append(
                f"| {d.lo_s:g}-{d.hi_s:g} | {d.revisits} | {d.realized:,.0f} | {d.forecast:,.0f} "
                f"| {d.realized / d.forecast:.3f} | {d.realized_spread:,.0f} "
                f"| {d.forecast_spread:,.0f} | {d.load_ratio:.3f} |"
            )
        lines += [
            "",
            "| N (blocks) | own hits: simulated | rule at realized D | forecast "
            + "".join(f"| {n} " for n in names)
            + "| whole: simulated | forecast error "
            + "".join(f"| {n} error " for n in names)
            + "|",
            "|---|---|---|---|" + "---|" * (2 * len(names) + 2),
        ]
        for c in self.capacities:
            lines.append(
                f"| {c.capacity_blocks:,} | {c.simulated_own:.4f} | {c.realized_rule_own:.4f} "
                f"| {c.forecast_own:.4f} "
                + "".join(f"| {c.rescaled_own[n]:.4f} " for n in names)
                + f"| {c.simulated:.4f} | {c.forecast - c.simulated:+.4f} "
                + "".join(f"| {c.rescaled(n) - c.simulated:+.4f} " for n in names)
                + "|"
            )
        lines += [
            "",
            "| GPU | host | mode | host tier: simulated | forecast error "
            + "".join(f"| {n} error " for n in names)
            + "|",
            "|---|---|---|---|---|" + "---|" * len(names),
        ]
        for gpu, host, mode, simulated, errors in self.host_tier():
            lines.append(
                f"| {gpu:,} | {host:,} | {mode} | {simulated:.4f} "
                + "".join(f"| {e:+.4f} " for e in errors)
                + "|"
            )
        lines += ["", "Rescalings of d(W) by each delay bin's load:"]
        lines += [f"- {name}: {meaning}." for name, meaning in RESCALINGS.items()]
        return "\n".join(lines)


def _trailing_rate(
    trace: SimTrace, requests: NDArray[np.int64], window_s: float
) -> NDArray[np.float64]:
    """Input blocks per second over the ``window_s`` seconds before each of ``requests``
    (over the time since the trace's first request, where that is shorter; at least 1 s)."""
    before = np.concatenate(([0], np.cumsum(trace.blocks)))
    now = trace.timestamp[requests]
    first = np.searchsorted(trace.timestamp, now - window_s)
    span = np.maximum(np.minimum(window_s, now - trace.timestamp[0]), 1.0)
    return (before[requests] - before[first]) / span


def _periods(
    trace: SimTrace, measured: NDArray[np.bool_], revisits: Revisits, parts: int = 5
) -> list[PeriodRow]:
    """Load and revisit rate over ``parts`` equal spans of the measured requests' times."""
    times = trace.timestamp[measured]
    edges = np.linspace(times.min(), times.max(), parts + 1)
    slot = np.clip(np.searchsorted(edges, trace.timestamp, side="right") - 1, 0, parts - 1)
    blocks = np.bincount(slot[measured], weights=trace.blocks[measured], minlength=parts)
    comebacks = np.bincount(slot[revisits.request], minlength=parts)
    width = float(edges[1] - edges[0]) or 1.0
    return [
        PeriodRow(
            float(edges[i] - edges[0]),
            float(edges[i + 1] - edges[0]),
            float(blocks[i]) / width,
            float(comebacks[i]) / width,
        )
        for i in range(parts)
    ]


def _own_hits(revisits: Revisits, hits: NDArray[np.int64]) -> float:
    """Blocks of the revisits' own reuse inside the simulator's hit prefix of each request."""
    return float(
        sum(
            np.count_nonzero(positions < hits[r])
            for r, positions in zip(revisits.request, revisits.own_positions, strict=True)
        )
    )


def displacement_report(
    workload: ValidationWorkload,
    capacities: Sequence[int] = CAPACITIES,
    gpu: Sequence[int] = TierGrid.gpu,
    host: Sequence[int] = TierGrid.host,
) -> DisplacementReport:
    """The report for ``workload`` at ``capacities`` and the tier grid ``gpu`` x ``host``
    (blocks): its trace taken whole, or its steady requests where it names them (``agent``,
    whose statistics are those requests')."""
    sample, trace = workload.sample, workload.trace
    if sample.lambda0 is None:
        raise ValueError("the sample has no conversation rate")
    model = shared_model(sample, sample.lambda0, refinement="partial")
    if not isinstance(model, FluctuationModel):
        raise ValueError("the forecast is not the partial-residency model")
    revisits = measure_revisits(trace)
    measured = workload.steady_requests()
    if measured is None:
        measured = np.ones(len(trace), dtype=bool)
    else:
        revisits = revisits.select(measured[revisits.request])
    W, v, D, G = revisits.delay_s, revisits.own, revisits.displacement, revisits.load
    d, sd = model.base.displacement(W), model.displacement_sd(W)
    total = sample.total()
    blocks_per_s = sample.lambda0 * total.sum_R / total.conversations
    bins = np.floor(np.log2(np.maximum(W, 0.5))).astype(np.int64)
    keys, member = np.unique(bins, return_inverse=True)
    # Per delay bin: the load the revisits' gaps carried (blocks) against the load they would
    # have carried at each reference rate (blocks per s).
    gap_load = np.bincount(member, weights=G)
    references = {
        "load-scaled": np.full(W.size, blocks_per_s),
        "self-normalised": np.full(
            W.size, blocks_per_s * float(np.sum(G) / np.sum(blocks_per_s * W))
        ),
        "trailing-rate": _trailing_rate(trace, revisits.request, TRAILING_S),
    }
    load_ratio = {
        name: gap_load / np.bincount(member, weights=references[name] * W) for name in RESCALINGS
    }
    delays = [
        DelayRow(
            lo_s=0.0 if key < 0 else float(2.0**key),
            hi_s=float(2.0 ** (key + 1)),
            revisits=int(np.count_nonzero(member == i)),
            realized=float(D[member == i].mean()),
            forecast=float(d[member == i].mean()),
            realized_spread=float((D - d)[member == i].std()),
            forecast_spread=float(sd[member == i].mean()),
            load_ratio=float(load_ratio["load-scaled"][i]),
        )
        for i, key in enumerate(keys)
    ]
    rescaled = {name: d * ratio[member] for name, ratio in load_ratio.items()}
    input_blocks = float(trace.blocks[measured].sum())
    lru = get_policy("lru", "block")
    wanted = sorted(
        {*capacities}
        | {int(n) for g in gpu for h in host for mode in TIER_MODES for n in reach((g, h), mode)}
    )
    forecasts = model.hit_ratio(np.array(wanted, dtype=np.float64))
    rows = []
    for n, forecast in zip(wanted, forecasts, strict=True):
        hits = np.asarray(lru(trace, n))
        rows.append(
            CapacityRow(
                capacity_blocks=n,
                simulated_own=_own_hits(revisits, hits) / input_blocks,
                realized_rule_own=float(np.minimum(v, np.maximum(n - D, 0.0)).sum()) / input_blocks,
                forecast_own=float(prefix_reused(n - d, sd, v).sum()) / input_blocks,
                simulated=float(hits[measured].sum()) / input_blocks,
                forecast=float(forecast),
                rescaled_own={
                    name: float(prefix_reused(n - scaled, sd, v).sum()) / input_blocks
                    for name, scaled in rescaled.items()
                },
            )
        )
    return DisplacementReport(
        delays, rows, (tuple(gpu), tuple(host)), _periods(trace, measured, revisits)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", default=str(DEFAULT_MOONCAKE), help="Mooncake-format JSONL")
    source.add_argument(
        "--preset",
        choices=(*SHARING_PRESETS, *AGENT_PRESETS),
        help="a generated preset as the tier validation generates it, instead of a trace",
    )
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    grid = TierGrid()
    if args.preset in AGENT_PRESETS:
        gpu, host = grid.agent_gpu, grid.agent_host
        report = displacement_report(agent_workload(grid.agent_duration_s), gpu, gpu, host)
    elif args.preset is not None:
        report = displacement_report(generated_workload(args.preset, grid))
    else:
        report = displacement_report(mooncake_workload(args.trace))
    text = report.to_markdown()
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
