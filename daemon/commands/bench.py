"""``kvcast bench``: measured figures, each against a baseline timed in the same run."""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

from kvcast.daemon.bench.throughput import run_throughput

SUITES = ("throughput",)


def _markdown(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| benchmark | figure | baseline (same run) | ratio |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


@click.command("bench")
@click.option(
    "--suite",
    "suites",
    type=click.Choice(SUITES),
    multiple=True,
    help="Suites to run (repeatable; default: all).",
)
@click.option(
    "--conversations",
    type=click.IntRange(min=100),
    default=20_000,
    show_default=True,
    help="Conversations in the throughput workload.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object of figures.")
def bench(suites: tuple[str, ...], conversations: int, as_json: bool) -> None:
    """Run the benchmark suites; print a Markdown table (the README's) or JSON."""
    chosen = suites or SUITES
    results: dict[str, Any] = {}
    rows: list[tuple[str, str, str, str]] = []
    if "throughput" in chosen:
        throughput = run_throughput(conversations=conversations)
        results["throughput"] = throughput.to_dict()
        rows += throughput.rows()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        click.echo(_markdown(rows))
