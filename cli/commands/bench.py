"""``kvcast bench``: measured figures, each against a baseline timed in the same run."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click
import orjson

from kvcast.cli.options import Ints
from kvcast.daemon.gc_tuning import tune_for_streaming
from kvcast.lab.bench.client_bench import run_client_bench
from kvcast.lab.bench.machine import describe_machine, machine_line
from kvcast.lab.bench.throughput import run_throughput
from kvcast.lab.reports.validation import ValidationGrid, measure_speed, run_validation

SUITES = (
    "throughput", "replay", "solver", "client", "tap", "classifier", "policies", "validation",
    "daemon", "engines", "shadow", "sharing", "sim-scale",
)  # fmt: skip
# "classifier" loads the model, "policies" and "validation" take minutes, "daemon" needs a
# broker and a Redis and "engines" the engines' venvs (scripts/engine_venv.sh), "shadow" runs
# the exact block simulator over 10^6 requests at 17 capacities (minutes), "sharing" validates
# the forecast with shared blocks against block-level LRU (minutes), "sim-scale" runs kvcast
# simulate on 10 M block references per policy and capacity (minutes): ask for them by name.
DEFAULT_SUITES = ("throughput", "replay", "solver", "client")


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
    help="Suites to run (repeatable; default: " + ", ".join(DEFAULT_SUITES) + ").",
)
@click.option(
    "--conversations",
    type=Ints(min=100),
    default=20_000,
    show_default=True,
    help="Conversations in the throughput workload.",
)
@click.option(
    "--kafka",
    default="127.0.0.1:19092",
    show_default=True,
    envvar="KVCAST_BENCH_KAFKA",
    help="Broker for the daemon suite.",
)
@click.option(
    "--redis",
    "redis_url",
    default="redis://127.0.0.1:6379/0",
    show_default=True,
    envvar="KVCAST_BENCH_REDIS",
    help="Redis for the daemon suite.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Validation and policies suites: the small grids of the tests; shadow: 50,000 requests; "
    "sim-scale: 30 agent conversations at one capacity.",
)
@click.option(
    "--shadow-requests",
    type=Ints(min=1000),
    default=1_000_000,
    show_default=True,
    help="Requests in the shadow suite's workload.",
)
@click.option(
    "--shadow-exact-requests",
    type=Ints(min=1000),
    default=None,
    help="Shadow suite: measure the error on this many first requests (default: all).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object of figures.")
def bench(
    suites: tuple[str, ...],
    conversations: int,
    kafka: str,
    redis_url: str,
    quick: bool,
    shadow_requests: int,
    shadow_exact_requests: int | None,
    as_json: bool,
) -> None:
    """Run the benchmark suites; print a Markdown table (docs/performance.md's) or JSON."""
    tune_for_streaming()  # the figures are those of `kvcast run` and `kvcast replay`
    chosen = suites or DEFAULT_SUITES
    machine = describe_machine()
    results: dict[str, Any] = {"machine": machine}
    rows: list[tuple[str, str, str, str]] = []
    if "throughput" in chosen:
        throughput = run_throughput(conversations=conversations)
        results["throughput"] = throughput.to_dict()
        rows += throughput.rows()
    if "replay" in chosen:
        from kvcast.lab.bench.replay_command import run_replay_command, run_replay_sharing

        replay = run_replay_command()
        results["replay"] = replay.to_dict()
        rows += replay.rows()
        sharing = run_replay_sharing()
        results["replay_sharing"] = sharing.to_dict()
        rows += sharing.rows()
    if "solver" in chosen and "validation" not in chosen:
        speed = measure_speed()
        results["solver"] = {**dataclasses.asdict(speed), "ratio": speed.ratio}
        rows.append(
            (
                f"capacity curve, {speed.points} points, {speed.delays:,} delays",
                f"{speed.exact_s * 1e3:.2f} ms (exact piecewise-linear solver)",
                f"{speed.naive_s * 1e3:.0f} ms (brentq per point, numpy d(T))",
                f"{speed.ratio:,.0f}x",
            )
        )
    if "client" in chosen:
        client = run_client_bench()
        results["client"] = client.to_dict()
        rows += client.rows()
    if "tap" in chosen:
        from kvcast.lab.bench.tap_bench import run_tap_bench

        tap = run_tap_bench()
        results["tap"] = tap.to_dict()
        rows += tap.rows()
    if "classifier" in chosen:
        from kvcast.lab.bench.classifier_bench import run_classifier_bench

        classifier = run_classifier_bench()
        results["classifier"] = classifier.to_dict()
        rows += classifier.rows()
    if "engines" in chosen:
        from kvcast.lab.bench.engines import EngineBenchError, run_engine_benches

        try:
            engines = run_engine_benches()
        except EngineBenchError as exc:
            raise click.ClickException(str(exc)) from exc
        results["engines"] = engines
        rows += [tuple(row) for figures in engines.values() for row in figures["rows"]]
    if "policies" in chosen:
        from kvcast.lab.reports.policy_report import run_policy_report

        policies = run_policy_report(quick=quick, progress=lambda line: click.echo(line, err=True))
        results["policies"] = policies.to_dict()
        rows += policies.bench_rows()
        if not as_json:
            click.echo(policies.to_markdown())
    if "validation" in chosen:
        grid = ValidationGrid.quick() if quick else ValidationGrid()
        report = run_validation(grid, progress=lambda line: click.echo(line, err=True))
        results["validation"] = report.to_dict()
        rows += report.rows()
        if not as_json:
            click.echo(report.to_markdown())
    if "sharing" in chosen:
        from kvcast.lab.reports.sharing_validation import SharingGrid, run_sharing_validation

        sharing = run_sharing_validation(
            SharingGrid.quick() if quick else SharingGrid(),
            progress=lambda line: click.echo(line, err=True),
        )
        results["sharing"] = sharing.to_dict()
        if not as_json:
            click.echo(sharing.to_markdown())
    if "shadow" in chosen:
        from kvcast.lab.bench.shadow_bench import run_shadow_bench

        shadow = run_shadow_bench(
            requests=50_000 if quick else shadow_requests, exact_requests=shadow_exact_requests
        )
        results["shadow"] = shadow.to_dict()
        rows += shadow.rows()
    if "sim-scale" in chosen:
        from kvcast.lab.bench.sim_scale import run_sim_scale

        scale = run_sim_scale(
            30 if quick else 1000,
            capacities=(1000,) if quick else (1000, 16000),
            progress=lambda line: click.echo(line, err=True),
        )
        results["sim-scale"] = scale.to_dict()
        rows += scale.rows()
    if "daemon" in chosen:
        from kvcast.lab.bench.daemon_bench import run_daemon_bench

        daemon = run_daemon_bench(kafka, redis_url)
        results["daemon"] = dataclasses.asdict(daemon)
        rows += daemon.rows()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        click.echo(_markdown(rows))
        click.echo(f"\n{machine_line(machine)}")
