"""Running a report's independent tasks (one per workload) in worker processes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

Task = TypeVar("Task")
Result = TypeVar("Result")


def map_tasks(work: Callable[[Task], Result], tasks: Sequence[Task], jobs: int) -> list[Result]:
    """``work`` over ``tasks`` in order, in up to ``jobs`` processes (in this one when 1)."""
    jobs = max(1, min(jobs, len(tasks)))
    if jobs == 1:
        return [work(task) for task in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(work, tasks))
