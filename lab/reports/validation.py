"""Validation of the hit-ratio forecast against Algorithm 1 (SPEC section 4): the grid runner.

For every (preset, lambda0) one trace is generated (deterministic seed) and used for every
capacity N: its events go through the product's statistics path (``parse_event`` ->
``StatsEngine.apply`` -> ``finish`` -> ``snapshot().sample``) and every estimator
(variant x displacement x refinement of ``kvcast.stats.forecast``) is solved from that sample;
the whole-content LRU simulator runs on the same trace (warm-up and cool-down 0.2). Errors are
forecast minus simulation, in hit-ratio points. Also: the mean-field theorem series (lambda0 and
N scaled together) and the solver speed against a naive baseline timed in the same run.
The results and their rendering live in ``validation_report``, the figure in ``validation_plot``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import brentq

from kvcast.lab.reports.samples import sample_from_events
from kvcast.lab.reports.validation_plot import plot_report
from kvcast.lab.reports.validation_report import (
    PointResult,
    SpeedResult,
    ValidationGrid,
    ValidationReport,
)
from kvcast.lab.sim.registry import simulate
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.finite_size import FluctuationModel, final_blocks_second_moment
from kvcast.stats.forecast import (
    DEFAULT_DISPLACEMENT,
    DEFAULT_REFINEMENT,
    DEFAULT_VARIANT,
    DISPLACEMENTS,
    REFINEMENTS,
    VARIANTS,
    revisit_weights,
    sample_model,
)
from kvcast.stats.sample import IntentMoments, WorkloadSample

SINGLE_CLASS = "paper/hashable/none"  # the paper's estimator (hit_ratio_single_class)
PRODUCT = f"{DEFAULT_VARIANT}/{DEFAULT_DISPLACEMENT}/{DEFAULT_REFINEMENT}"  # hit_ratio
MEAN_FIELD_INTENT = "intent/whole/none"  # SPEC's intent-aware formula, no refinement


def estimator_names() -> tuple[str, ...]:
    """Every selectable estimator as ``variant/displacement/refinement`` (paper: hashable)."""
    return tuple(
        f"{v}/{d}/{r}"
        for v in VARIANTS
        for d in DISPLACEMENTS
        if not (v == "paper" and d == "whole")
        for r in REFINEMENTS
    )


def evaluate_trace(
    name: str,
    lambda0: float,
    duration_s: float,
    seed: int,
    capacities: tuple[int, ...],
    block_size: int,
) -> list[PointResult]:
    """Generate one trace, derive the statistics from its events, simulate and forecast."""
    trace = generate(
        preset(name), lambda0=lambda0, duration_s=duration_s, seed=seed, block_size=block_size
    )
    sample = sample_from_events(trace.events(), block_size)
    lam = float(sample.lambda0 or 0.0)
    caps = np.asarray(capacities, dtype=np.float64)
    forecasts: dict[str, np.ndarray] = {}
    for est in estimator_names():
        variant, disp, refinement = est.split("/")
        forecasts[est] = sample_model(sample, lam, variant, disp, refinement).hit_ratio(caps)
    sim_trace = trace.sim_trace()
    out = []
    for i, n in enumerate(capacities):
        sim = simulate(sim_trace, n, warmup_fraction=0.2, cooldown_fraction=0.2)
        out.append(
            PointResult(
                preset=name,
                lambda0=lambda0,
                lambda0_measured=lam,
                capacity_blocks=n,
                simulated=sim.hit_ratio,
                forecasts={k: float(v[i]) for k, v in forecasts.items()},
                duration_s=duration_s,
                conversations=trace.conversations,
                measured_conversations=sim.measured_conversations,
            )
        )
    return out


def _evaluate(args: tuple) -> list[PointResult]:
    return evaluate_trace(*args)


def measure_speed(delays: int = 100_000, points: int = 100, seed: int = 7) -> SpeedResult:
    """Time a ``points``-capacity curve on ``delays`` revisits: the product's exact solver,
    a naive brentq-per-point baseline, and the fluctuation and partial refinements, partial
    both grouped (the product's) and summed over every revisit (best of repeats)."""
    rng = np.random.default_rng(seed)
    L = max(1, int(delays * 0.28))
    W = rng.exponential(135.0, delays)
    R = rng.integers(1, 60, delays)
    mom = IntentMoments(
        L,
        float(R.sum()) * 1.6,
        float(R.sum()),
        float((R - 1).sum()),
        float(L) * 14.0,
        float(L) * 4.5,
    )
    sample = WorkloadSample(
        ("a",), (mom,), W, R, np.zeros(delays, np.int32), np.ones(delays, np.int32), 1.0
    )
    caps = np.linspace(0.01, 1.0, points) * 20_000.0
    exact = sample_model(sample, 1.0, "sample", "whole", "tagged")  # the step function
    plain = sample_model(sample, 1.0, "sample", "whole", "none")
    fluct = sample_model(sample, 1.0, "sample", "whole", "fluctuation")
    partial = sample_model(sample, 1.0, "sample", "whole", "partial")
    assert isinstance(partial, FluctuationModel) and partial.groups is not None
    W, _, hit = revisit_weights(sample, "sample", "whole")
    partial_exact = FluctuationModel(
        partial.base, W, hit, R, EB2=final_blocks_second_moment(sample), partial=True,
        group_width=None,
    )  # fmt: skip

    def best(fn: Callable[[], object], repeats: int) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    w = R.astype(np.float64)
    v = np.maximum(w - 1.0, 0.0)
    E_B, lam = mom.sum_B / L, 1.0

    def naive() -> np.ndarray:
        h = np.empty(points)
        for i, n in enumerate(caps):

            def d(t: float, n: float = n) -> float:
                return lam * E_B * t + lam * float(np.sum(w * np.minimum(W, t))) / L - n

            hi = 1.0
            while d(hi) < 0:
                hi *= 2.0
            t_c = brentq(d, 0.0, hi, xtol=1e-9)
            h[i] = float(np.sum(v[t_c >= W])) / (L * mom.sum_R / L)
        return h

    exact_s = best(lambda: exact.curve(caps), 20)
    naive_s = best(naive, 2)
    diff = float(np.max(np.abs(naive() - plain.hit_ratio(caps))))
    return SpeedResult(
        delays, points, exact_s, naive_s, best(lambda: fluct.curve(caps), 2), diff,
        partial_s=best(lambda: partial.curve(caps), 20),
        partial_exact_s=best(lambda: partial_exact.curve(caps), 2),
        partial_groups=len(partial.groups),
        partial_max_abs_diff=float(
            np.max(np.abs(partial.hit_ratio(caps) - partial_exact.hit_ratio(caps)))
        ),
    )  # fmt: skip


def run_validation(
    grid: ValidationGrid | None = None, progress: Callable[[str], None] | None = None
) -> ValidationReport:
    """Run the grid, the theorem series and the speed check; see the module docstring."""
    grid = grid or ValidationGrid()
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    tasks = []
    for p_idx, name in enumerate(grid.presets):
        for l_idx, lam in enumerate(grid.lambdas):
            dur = grid.trace_duration(lam, grid.min_conversations)
            seed = grid.seed + 100 * p_idx + l_idx
            tasks.append(("grid", (name, lam, dur, seed, grid.capacities, grid.block_size)))
    for t_idx, (lam, n) in enumerate(grid.theorem):
        dur = grid.trace_duration(lam, grid.theorem_conversations)
        seed = grid.seed + 10_000 + t_idx
        tasks.append(("theorem", (grid.theorem_preset, lam, dur, seed, (n,), grid.block_size)))
    # Largest traces first, so that the workers finish together.
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i][1][1] * tasks[i][1][2])
    results: dict[int, list[PointResult]] = {}
    jobs = max(1, min(grid.jobs, len(tasks)))
    with ProcessPoolExecutor(jobs) if jobs > 1 else _Inline() as pool:
        for i, res in zip(order, pool.map(_evaluate, [tasks[i][1] for i in order]), strict=True):
            results[i] = res
            name, lam = tasks[i][1][0], tasks[i][1][1]
            say(
                f"{tasks[i][0]} {name} lambda0={lam:g}: {len(res)} points "
                f"({time.perf_counter() - started:.0f} s)"
            )
    points = [p for i in range(len(tasks)) if tasks[i][0] == "grid" for p in results[i]]
    theorem = [p for i in range(len(tasks)) if tasks[i][0] == "theorem" for p in results[i]]
    say("solver speed")
    speed = measure_speed(grid.speed_delays, grid.speed_points)
    return ValidationReport(
        grid=grid,
        points=points,
        theorem=theorem,
        speed=speed,
        product=PRODUCT,
        single_class=SINGLE_CLASS,
        mean_field_intent=MEAN_FIELD_INTENT,
        elapsed_s=time.perf_counter() - started,
    )


class _Inline:
    """A one-process stand-in for ``ProcessPoolExecutor`` (``map`` in order)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Callable, items: list) -> list:  # type: ignore[type-arg]
        return [fn(x) for x in items]


def main(argv: list[str] | None = None) -> int:
    """``python -m kvcast.lab.reports.validation [--quick] [--jobs J] [--markdown F]
    [--json F] [--plot F.png]``: run and print the Markdown report (0 when all criteria pass)."""
    import argparse
    import sys

    import orjson

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the reduced grid of the tests")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes")
    ap.add_argument("--markdown", type=Path, help="also write the Markdown report here")
    ap.add_argument("--json", type=Path, help="write the JSON report here")
    ap.add_argument("--plot", type=Path, help="write the PNG figure here")
    args = ap.parse_args(argv)
    grid = ValidationGrid.quick() if args.quick else ValidationGrid()
    if args.jobs:
        grid = replace(grid, jobs=args.jobs)
    report = run_validation(grid, progress=lambda m: print(m, file=sys.stderr, flush=True))
    text = report.to_markdown()
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
    if args.plot:
        plot_report(report, args.plot)
    return 0 if all(a["passed"] for a in report.acceptance().values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
