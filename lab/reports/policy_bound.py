"""How much of the LRU-to-TB+S gap a ranking by (state, age) can close: ``density`` given each
state's law *from the trace itself* (in-sample, the measured conversations included) instead of
the table's log-normal fit learned from the warm-up, at several horizons.

It is a diagnostic, not a policy: no engine can know the law of the conversations it is
about to serve. It separates two causes of the gap that ``docs/policies.md`` reports at small
caches: a ranking that uses its information badly (a wrong law, a wrong horizon), which this
bound would beat by far, and information that does not say which block comes back soon, which
no ranking by (state, age) gets past.

A request's blocks are reused when its conversation sends the next turn, ``T`` seconds after
the request arrived (infinite for the last turn). For a state's requests, at each age bucket
``a`` of the client's grid and a horizon ``H`` (s), the empirical hit density is::

    d(a) = #{a < T <= a + H} / sum over T > a of min(T - a, H)

the sample version of ``kvcast.exporters.kit.density.hit_density`` (the state's ``S(a)`` cancels the
same way). A state with fewer than :data:`MIN_SAMPLES` requests takes its intent's pooled law.
Shared blocks keep the table's shared law.

With ``--warmup-law`` the empirical law is learned on the warm-up's conversations, as the
table is: an empirical law in the table instead of the log-normal, an engine could have that.
With ``--cross-fit K`` it is cross-fitted: conversations fall into K folds by id and each
request's law is learned on the other folds, from the same hours of traffic (a drift
included) but never from its own conversation. What the in-sample bound gains over the
cross-fitted one is knowledge of the measured conversations themselves, which no ranking can
have; what the cross-fitted one gains over the table is what a better law could give.
The empirical law is keyed by each request's own intent (the state whose blocks it leaves),
where the table's statistics key a conversation's every state by its latest intent (SPEC
section 3).

By default the bound runs where the gap target applies (LRU under half of the unlimited
cache); ``--every-capacity`` runs it at every capacity of the report, for issue 33's target:
``density`` at least :data:`BOUND_SHARE` of the in-sample bound's hit ratio everywhere.
``--workloads`` keeps the named workloads of the report's; ``--seed S`` generates its presets
from another seed (Mooncake is one trace), to see how far a share moves with the draw.

``python -m kvcast.lab.reports.policy_bound [--warmup-law | --cross-fit K] [--every-capacity]
[--workloads agent,mixed] [--seed S] [--markdown docs/policies.md] [--json]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson
from numpy.typing import NDArray

from kvcast.exporters.kit.ages import AGE_BUCKETS, bucket_age
from kvcast.exporters.kit.density import value_changes
from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.reports.policy_report import default_workloads, write_between_markers
from kvcast.lab.reports.policy_results import GAP_SHARE, Workload, gap_closed
from kvcast.lab.sim.block_cache import BlockCache, BlockLayout, block_layout
from kvcast.lab.sim.block_policies import Density
from kvcast.lab.sim.policy_tables import history_mask, intent_labels, learn_table
from kvcast.lab.sim.registry import measure, simulate
from kvcast.lab.sim.trace import SimTrace

MIN_SAMPLES = 30  # requests of a state below which it takes its intent's pooled law
HORIZONS_S = (10.0, 30.0, 60.0, 120.0, 600.0)
BOUND_SHARE = 0.97  # issue 33: density >= this x the in-sample bound's hit ratio
MARKERS = {  # (law, every capacity) -> the markers its table is written between
    ("in-sample", False): ("<!-- policy-bound:begin -->", "<!-- policy-bound:end -->"),
    ("warm-up", False): ("<!-- policy-bound-warmup:begin -->", "<!-- policy-bound-warmup:end -->"),
    ("cross-fitted", False): (
        "<!-- policy-bound-crossfit:begin -->",
        "<!-- policy-bound-crossfit:end -->",
    ),
    ("in-sample", True): ("<!-- policy-bound-every:begin -->", "<!-- policy-bound-every:end -->"),
    ("warm-up", True): (
        "<!-- policy-bound-every-warmup:begin -->",
        "<!-- policy-bound-every-warmup:end -->",
    ),
    ("cross-fitted", True): (
        "<!-- policy-bound-every-crossfit:begin -->",
        "<!-- policy-bound-every-crossfit:end -->",
    ),
}


def next_turn_delays(trace: SimTrace) -> NDArray[np.float64]:
    """Per request, the seconds from its arrival to its conversation's next turn (inf: none)."""
    order = np.lexsort((trace.turn, trace.conversation))
    conv, times = trace.conversation[order], trace.timestamp[order]
    delays = np.full(len(trace), np.inf)
    same = conv[1:] == conv[:-1]
    delays[order[:-1]] = np.where(same, times[1:] - times[:-1], np.inf)
    return delays


def empirical_curve(delays: NDArray[np.float64], horizon_s: float) -> list[float]:
    """The empirical hit density (1/s) of requests with these delays (s; inf: never reused)
    at each age bucket's age (:func:`kvcast.exporters.kit.ages.bucket_age`)."""
    finite = np.sort(delays[np.isfinite(delays)])
    never = len(delays) - len(finite)
    sums = np.concatenate([[0.0], np.cumsum(finite)])
    ages = np.array([bucket_age(k) for k in range(AGE_BUCKETS)])
    alive = np.searchsorted(finite, ages, side="right")  # finite[alive:] > a
    done = np.searchsorted(finite, ages + horizon_s, side="right")  # finite[alive:done] hit
    hits = done - alive
    residency = (sums[done] - sums[alive]) - ages * hits + (len(finite) - done + never) * horizon_s
    density = np.divide(hits, residency, out=np.zeros(AGE_BUCKETS), where=residency > 0)
    return [float(v) for v in density]


class InSampleDensity(Density):
    """``density`` whose per-request curves are given (shared blocks: the table's law)."""

    def __init__(self, table: PriorityIndex, curves: Sequence[list[float]]) -> None:
        super().__init__(table)
        self.given = curves
        self.given_changes: dict[int, list[int]] = {}

    def begin(self, request: int, now: float) -> None:
        super().begin(request, now)
        values = self.given[request]
        changes = self.given_changes.get(id(values))
        if changes is None:
            changes = self.given_changes[id(values)] = value_changes(values)
        self.curves[request], self.change[request] = values, changes


def empirical_curves(
    trace: SimTrace,
    horizon_s: float,
    learn: NDArray[np.bool_] | None = None,
    folds: int = 1,
) -> list[list[float]]:
    """Each request's curve: its state's (intent, turn) empirical law over the requests
    ``learn`` selects (default: the whole trace, in-sample).

    ``folds`` > 1 cross-fits the law: conversations fall into ``folds`` folds by id, and a
    request's curve is learned on the other folds' requests only, so that no request's law
    has seen its own conversation (nor its own delay) while it still comes from the same
    traffic, drift included."""
    delays = next_turn_delays(trace)
    labels = intent_labels(trace)
    states = list(zip(labels, trace.turn.tolist(), strict=True))
    selected = np.ones(len(states), dtype=bool) if learn is None else learn
    fold_of = trace.conversation % folds
    out: list[list[float]] = [[] for _ in states]
    for fold in range(folds):
        learned_on = selected & (fold_of != fold) if folds > 1 else selected
        applies_to = np.flatnonzero(fold_of == fold)
        law = _state_law(states, delays, learned_on, horizon_s)
        for r in applies_to.tolist():
            out[r] = law(states[r])
    return out


def _state_law(
    states: Sequence[tuple[str, int]],
    delays: NDArray[np.float64],
    learned_on: NDArray[np.bool_],
    horizon_s: float,
) -> Callable[[tuple[str, int]], list[float]]:
    """The curve of each state, learned on the requests ``learned_on`` selects; a state with
    fewer than :data:`MIN_SAMPLES` of them takes its intent's pooled law (one list per law)."""
    members: dict[tuple[str, int], list[int]] = {}
    pooled: dict[str, list[int]] = {}
    for r in np.flatnonzero(learned_on).tolist():
        members.setdefault(states[r], []).append(r)
        pooled.setdefault(states[r][0], []).append(r)
    curves: dict[tuple[str, int], list[float]] = {}

    def law(state: tuple[str, int]) -> list[float]:
        own = members.get(state, [])
        key = state if len(own) >= MIN_SAMPLES else (state[0], 0)
        curve = curves.get(key)
        if curve is None:
            rows = own if key == state else pooled.get(state[0], [])
            curve = curves[key] = empirical_curve(delays[rows], horizon_s)
        return curve

    return law


@dataclass(frozen=True)
class BoundRow:
    workload: str
    capacity_blocks: int
    lru: float
    tbs: float
    density: float  # the table's law, learned from the warm-up (the report's column)
    empirical: dict[float, float]  # horizon (s) -> hit ratio

    @property
    def best(self) -> tuple[float, float]:
        """(horizon s, hit ratio) of the best horizon for the empirical law."""
        return max(self.empirical.items(), key=lambda item: item[1])

    def closed(self, value: float) -> float:
        found = gap_closed(value, self.lru, self.tbs)
        return float("nan") if found is None else found

    @property
    def share(self) -> float:
        """The table's density hit ratio over the bound's (best horizon); nan: a bound of 0."""
        best = self.best[1]
        return self.density / best if best > 0 else float("nan")


def bound_rows(
    wl: Workload,
    horizons_s: Sequence[float] = HORIZONS_S,
    layout: BlockLayout | None = None,
    warmup_law: bool = False,
    every_capacity: bool = False,
    folds: int = 1,
) -> list[BoundRow]:
    """The bound at each of ``wl``'s capacities where LRU holds under half of the unlimited
    cache's hit ratio (the capacities of the gap target; ``every_capacity``: at all of them).
    ``warmup_law``: the empirical law learned on the warm-up's conversations, as the table is,
    instead of in-sample; ``folds`` > 1: cross-fitted (:func:`empirical_curves`)."""
    layout = layout or block_layout(wl.trace)
    window = (wl.warmup_fraction, wl.cooldown_fraction)
    everything = int(wl.trace.blocks.sum()) + 1
    unlimited = simulate(wl.trace, everything, "lru", "block", *window, layout=layout).hit_ratio
    learn = history_mask(wl.trace, wl.warmup_fraction) if warmup_law else None
    curves = {h: empirical_curves(wl.trace, h, learn, folds) for h in horizons_s}
    rows = []
    for n in wl.capacities:
        lru = simulate(wl.trace, n, "lru", "block", *window, layout=layout).hit_ratio
        if lru >= unlimited / 2 and not every_capacity:
            continue
        tbs = simulate(wl.trace, n, "tbs", "block", *window, layout=layout).hit_ratio
        table = learn_table(wl.trace, wl.warmup_fraction, None, capacity_blocks=n)
        density = simulate(
            wl.trace, n, "density", "block", *window, layout=layout, table=table
        ).hit_ratio
        index = PriorityIndex(table)
        found = {}
        for h, per_request in curves.items():
            hits = BlockCache(wl.trace, layout).run(n, InSampleDensity(index, per_request))
            found[h] = measure(wl.trace, hits, n, "density, given law", "block", *window).hit_ratio
        rows.append(BoundRow(wl.name, n, lru, tbs, density, found))
    return rows


def to_markdown(rows: Sequence[BoundRow], law: str = "in-sample") -> str:
    """The bound's table; ``law``: what the empirical law was learned on, for the headings."""
    reached = sum(row.closed(row.best[1]) >= GAP_SHARE for row in rows)
    held = [row for row in rows if not row.share >= BOUND_SHARE]
    lines = [
        f"| workload | N (blocks) | LRU | density (table) | {law}, best horizon | TB+S "
        f"| gap closed: density | gap closed: {law} | density / {law} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        horizon, best = row.best
        lines.append(
            f"| {row.workload} | {row.capacity_blocks:,} | {row.lru:.3f} | {row.density:.3f} "
            f"| {best:.3f} (H = {horizon:g} s) | {row.tbs:.3f} | {row.closed(row.density):+.0%} "
            f"| {row.closed(best):+.0%} | {row.share:.3f} |"
        )
    lines.append("")
    lines.append(
        f"The {law} law closes a third of the gap at {reached} of {len(rows)} points "
        f"(horizons tried: {', '.join(f'{h:g}' for h in sorted(rows[0].empirical))} s)."
        if rows
        else "No capacity where LRU holds under half of the unlimited cache."
    )
    if rows:
        missed = ", ".join(f"{r.workload} N={r.capacity_blocks:,} ({r.share:.3f})" for r in held)
        lines.append(
            f"`density` holds at least {BOUND_SHARE} of the {law} law's hit ratio at "
            f"{len(rows) - len(held)} of {len(rows)} points"
            + (f"; not at {missed}." if held else ".")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the report's smaller workloads")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    parser.add_argument(
        "--warmup-law",
        action="store_true",
        help="learn the empirical law on the warm-up (as the table is), not in-sample",
    )
    parser.add_argument(
        "--every-capacity",
        action="store_true",
        help="every capacity of the report, not only those of the gap target",
    )
    parser.add_argument(
        "--workloads", metavar="NAMES", help="comma-separated workloads of the report's to keep"
    )
    parser.add_argument(
        "--markdown", metavar="FILE", help="also write the table into FILE between its markers"
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="generate the report's presets from seed S (default: the report's, 7 and 3)",
    )
    parser.add_argument(
        "--cross-fit",
        type=int,
        default=1,
        metavar="K",
        help="learn each request's law on the other K-1 of K folds of conversations (K >= 2)",
    )
    args = parser.parse_args(argv)
    if args.cross_fit != 1 and (args.cross_fit < 2 or args.warmup_law):
        parser.error("--cross-fit takes K >= 2 folds, and not with --warmup-law")
    if args.seed is not None and args.markdown:
        parser.error("--seed draws other workloads than the doc's tables: not with --markdown")
    workloads = default_workloads(args.quick, args.seed)
    if args.workloads:
        keep = args.workloads.split(",")
        unknown = set(keep) - {wl.name for wl in workloads}
        if unknown:
            parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
        workloads = [wl for wl in workloads if wl.name in keep]
    rows: list[BoundRow] = []
    for wl in workloads:
        rows.extend(
            bound_rows(
                wl,
                warmup_law=args.warmup_law,
                every_capacity=args.every_capacity,
                folds=args.cross_fit,
            )
        )
        print(f"{wl.name}: {len(rows)} points so far", file=sys.stderr)
    law = "warm-up" if args.warmup_law else "cross-fitted" if args.cross_fit > 1 else "in-sample"
    text = to_markdown(rows, law)
    if args.markdown:
        write_between_markers(Path(args.markdown), text, *MARKERS[law, args.every_capacity])
    if args.json:
        print(orjson.dumps([asdict(row) for row in rows], option=orjson.OPT_NON_STR_KEYS).decode())
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
