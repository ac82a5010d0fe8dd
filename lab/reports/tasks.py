"""Running a report's independent tasks (one per workload) in worker processes, and the
command line the per-workload reports share."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

Task = TypeVar("Task")
Result = TypeVar("Result")
Point = TypeVar("Point")
Grid = TypeVar("Grid", bound="WorkloadGrid")


def map_tasks(work: Callable[[Task], Result], tasks: Sequence[Task], jobs: int) -> list[Result]:
    """``work`` over ``tasks`` in order, in up to ``jobs`` processes (in this one when 1)."""
    jobs = max(1, min(jobs, len(tasks)))
    if jobs == 1:
        return [work(task) for task in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(work, tasks))


class WorkloadGrid(Protocol):
    """What a per-workload report's grid (a frozen dataclass) names: the generator's presets,
    the Mooncake trace's path (None: left out) and the worker processes."""

    presets: tuple[str, ...]
    mooncake: str | None
    jobs: int


Evaluate = Callable[[str, Any], list[Any]]  # (preset name or trace path, grid) -> points


def _evaluate(task: tuple[Evaluate, str], grid: WorkloadGrid) -> list[Any]:
    evaluate, what = task
    return evaluate(what, grid)


class PerWorkloadReport(Protocol):
    """A report that :func:`run_per_workload` fills: its grid, points and seconds taken."""

    grid: Any
    points: list[Any]
    elapsed_s: float


Filled = TypeVar("Filled", bound=PerWorkloadReport)


def run_per_workload(
    report: Filled,
    evaluate_preset: Evaluate,
    evaluate_mooncake: Evaluate,
    label: str,
    progress: Callable[[str], None] | None = None,
) -> Filled:
    """``report`` with the points of every preset of its grid (``evaluate_preset``), then of
    the Mooncake trace where its file exists (``evaluate_mooncake``), computed in up to
    ``grid.jobs`` processes (both module-level functions, so that they pickle), and the
    seconds it took; ``progress`` hears one line per workload."""
    grid: WorkloadGrid = report.grid
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    tasks: list[tuple[Evaluate, str]] = [(evaluate_preset, p) for p in grid.presets]
    if grid.mooncake and Path(grid.mooncake).exists():
        tasks.append((evaluate_mooncake, grid.mooncake))
    results = map_tasks(functools.partial(_evaluate, grid=grid), tasks, grid.jobs)
    for (_, what), found in zip(tasks, results, strict=True):
        report.points += found
        say(f"{label} {what}: {len(found)} points ({time.perf_counter() - started:.0f} s)")
    report.elapsed_s = time.perf_counter() - started
    return report


class Report(Protocol):
    def to_markdown(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def passed(self) -> bool: ...


def report_main(
    argv: Sequence[str] | None,
    description: str,
    grids: tuple[Grid, Grid],
    run: Callable[[Grid, Callable[[str], None]], Report],
    plot: Callable[[Any, Path], None],
) -> int:
    """The command line of a per-workload report (``--quick``, ``--mooncake``, ``--jobs``,
    ``--markdown``, ``--json``, ``--plot``): ``grids`` is (full, quick); prints the Markdown
    and exits 0 when the report met its target, 1 when not."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="the reduced grid of the tests")
    ap.add_argument("--mooncake", help="the Mooncake synthetic trace (default: data/traces/)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--markdown", type=Path, help="also write the Markdown tables here")
    ap.add_argument("--json", type=Path, help="write the JSON report here")
    ap.add_argument("--plot", type=Path, help="write the PNG figure here")
    args = ap.parse_args(argv)
    grid = replace(grids[1] if args.quick else grids[0], jobs=max(1, args.jobs))  # type: ignore[type-var]
    if args.mooncake:
        grid = replace(grid, mooncake=args.mooncake)  # type: ignore[type-var]
    report = run(grid, lambda m: print(m, file=sys.stderr, flush=True))
    text = report.to_markdown()
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    if args.plot:
        plot(report, args.plot)
    return 0 if report.passed() else 1
