"""``kvcast simulate FILE.jsonl``: trace-driven cache simulation (SPEC section 10)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson

from kvcast.cli.options import Floats, Ints, block_size_option, pop_tiers, tier_options
from kvcast.lab.sim.measurement import check_fractions, coverage_warning, first_times
from kvcast.lab.sim.registry import PolicyUnavailable, get_policy, simulate
from kvcast.lab.sim.tiered_cache import TieredResult, measure_tiers, tiered_block_hits
from kvcast.lab.sim.trace import SimTrace
from kvcast.stats.events import EventRejected, parse_event
from kvcast.stats.tiers import GPU, Tier

_SHOWN_REJECTS = 20


@dataclass
class LoadReport:
    """What reading a replay file found: counts, and (line, reason, detail) per rejected line."""

    processed: int = 0
    duplicates: int = 0
    rejects: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        return len(self.rejects)


def load_sim_trace(path: str, block_size: int) -> tuple[SimTrace, LoadReport]:
    """Read a JSONL replay file into a :class:`SimTrace`; invalid lines are rejected with their
    line number and reason, duplicate request ids are kept once (the first)."""
    session: list[str] = []
    turn: list[int] = []
    ts: list[float] = []
    tokens: list[int] = []
    intents: list[str] = []
    hashes: list[list[int | str] | None] = []
    seen: set[str] = set()
    report = LoadReport()
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                ev = parse_event(line)
            except EventRejected as exc:
                report.rejects.append((lineno, exc.reason, exc.detail))
                continue
            if ev.request_id in seen:
                report.duplicates += 1
                continue
            seen.add(ev.request_id)
            session.append(ev.session_id)
            turn.append(ev.turn)
            ts.append(ev.timestamp)
            tokens.append(ev.input_tokens)
            intents.append(ev.intent or "unknown")
            hashes.append(ev.block_hashes)
    report.processed = len(session)
    has_hashes = any(h is not None for h in hashes)
    trace = SimTrace.from_columns(
        session, turn, ts, tokens, block_size, intents, hashes if has_hashes else None
    )
    return trace, report


def policy_options(
    policy: str,
    granularity: str,
    learn_fraction: float,
    refresh_s: float,
    threshold_s: float,
    size: str,
    table: dict[str, Any] | None,
    horizon_s: float | None = None,
) -> dict[str, Any]:
    """The options each block policy takes, from the command's flags."""
    if policy == "density":
        found = {"learn_fraction": learn_fraction, "size": size, "table": table}
        return found if horizon_s is None else {**found, "horizon_s": horizon_s}
    if policy == "iac" and granularity == "conversation":
        return {"learn_fraction": learn_fraction, "size": size, "table": table}
    if granularity != "block":
        return {}
    if policy == "iac":
        return {"learn_fraction": learn_fraction, "size": size, "table": table}
    if policy == "iac-rolling":
        return {"refresh_s": refresh_s, "size": size}
    if policy == "tbs":
        return {"threshold_s": threshold_s, "size": size}
    return {}


def measurement_warnings(
    trace: SimTrace, measured: int, warmup_fraction: float, cooldown_fraction: float
) -> list[str]:
    """What the user must know about the measured part of the trace (one line each): fewer
    than half of the conversations measured, where and how to measure more."""
    first = first_times(trace.conversation, trace.timestamp, trace.conversations)
    found = coverage_warning(first, measured, warmup_fraction, cooldown_fraction)
    if found is None:
        return []
    return [
        f"{found}; the hit ratio covers only the measured ones (a conversation far from the "
        "rest stretches the span: leave it out, or measure every conversation with "
        "--warmup-fraction 0 --cooldown-fraction 0)"
    ]


def _tty_progress(done: int, total: int) -> None:
    end = "\n" if done >= total else ""
    click.echo(f"\rsimulated {done:,}/{total:,} requests{end}", err=True, nl=False)


@click.command("simulate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--policy",
    default="lru",
    show_default=True,
    help="Cache policy: lru, iac, density (conversation or block); iac-rolling, tbs, lfu, gdsf "
    "(block).",
)
@click.option(
    "--capacity-blocks",
    type=Ints(min=1),
    required=True,
    help="Cache capacity N, KV blocks.",
)
@click.option(
    "--granularity",
    type=click.Choice(["conversation", "block"]),
    default="conversation",
    show_default=True,
    help="conversation: whole-content LRU (Algorithm 1); block: prefix-sharing blocks.",
)
@click.option(
    "--warmup-fraction",
    type=float,
    default=0.2,
    show_default=True,
    help="Skip conversations starting in this first fraction of the span of first-turn "
    "times (a warning when fewer than half are measured).",
)
@click.option(
    "--cooldown-fraction",
    type=float,
    default=0.2,
    show_default=True,
    help="Skip conversations starting in this last fraction of the span of first-turn times.",
)
@block_size_option
@click.option(
    "--learn-fraction",
    type=Floats(0, 1),
    default=0.2,
    show_default=True,
    help="iac: learn the table from conversations starting in this first fraction.",
)
@click.option(
    "--table",
    "table_file",
    type=click.Path(exists=True, dir_okay=False),
    help="iac: a priority table JSON (SPEC section 5) instead of learning one.",
)
@click.option(
    "--refresh-s",
    type=Floats(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="iac-rolling: re-learn the table every this many seconds of event time.",
)
@click.option(
    "--threshold-s",
    type=Floats(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="tbs: next-reuse threshold, seconds.",
)
@click.option(
    "--horizon-s",
    type=Floats(min=0, min_open=True, finite=True),
    default=None,
    help="density: horizon, seconds (default: the table's characteristic_time_s, the "
    "forecast's T_C at the capacity, at least 60 s; a value given here is used as given).",
)
@click.option(
    "--size",
    type=click.Choice(["block", "request"]),
    default="block",
    show_default=True,
    help="iac/tbs size term: block (all equal) or request (blocks of the request).",
)
@tier_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate_command(
    file: str,
    policy: str,
    capacity_blocks: int,
    granularity: str,
    warmup_fraction: float,
    cooldown_fraction: float,
    block_size: int,
    learn_fraction: float,
    table_file: str | None,
    refresh_s: float,
    threshold_s: float,
    size: str,
    as_json: bool,
    horizon_s: float | None = None,
    **tier_flags: Any,
) -> None:
    """Replay FILE.jsonl through a cache simulator and print the measured hit ratio
    (reused input blocks / input blocks over whole measured conversations); with --tier, a
    tiered LRU block cache and the blocks each tier serves."""
    try:
        get_policy(policy, granularity)
        check_fractions(warmup_fraction, cooldown_fraction)
    except (PolicyUnavailable, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    tiers, tier_mode = pop_tiers(tier_flags, capacity_blocks)
    if tiers and (granularity != "block" or policy != "lru"):
        raise click.UsageError(
            f"--tier simulates a tiered LRU block cache: it needs --granularity block and "
            f"--policy lru (got {policy}/{granularity})"
        )
    start = time.perf_counter()
    trace, report = load_sim_trace(file, block_size)
    load_s = time.perf_counter() - start
    for lineno, reason, detail in report.rejects[:_SHOWN_REJECTS]:
        click.echo(f"{file}:{lineno}: rejected ({reason}): {detail}", err=True)
    if report.rejected > _SHOWN_REJECTS:
        click.echo(
            f"{file}: ... and {report.rejected - _SHOWN_REJECTS} more rejected lines", err=True
        )
    if len(trace) == 0:
        raise click.ClickException(f"{file}: no valid events")
    if tiers:
        _simulate_tiers(
            file, trace, report, capacity_blocks, tiers, tier_mode, block_size,
            (warmup_fraction, cooldown_fraction), as_json, load_s,
        )  # fmt: skip
        return
    table = orjson.loads(Path(table_file).read_bytes()) if table_file else None
    options = policy_options(
        policy, granularity, learn_fraction, refresh_s, threshold_s, size, table, horizon_s
    )
    if granularity == "block" and sys.stderr.isatty():
        options["progress"] = _tty_progress
    try:
        result = simulate(
            trace,
            capacity_blocks,
            policy,
            granularity,
            warmup_fraction,
            cooldown_fraction,
            **options,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    warnings = measurement_warnings(
        trace, result.measured_conversations, warmup_fraction, cooldown_fraction
    )
    for warning in warnings:
        click.echo(f"warning: {file}: {warning}", err=True)
    if as_json:
        out: dict[str, Any] = result.to_dict()
        out.update(
            file=file,
            block_size=block_size,
            block_hashes=trace.block_hashes is not None,
            options={
                k: v
                for k, v in options.items()
                if k in ("learn_fraction", "refresh_s", "threshold_s", "size", "horizon_s")
            },
            load_s=load_s,
            requests_per_s=len(trace) / result.elapsed_s if result.elapsed_s > 0 else None,
            events={
                "processed": report.processed,
                "rejected": report.rejected,
                "duplicates": report.duplicates,
            },
            rejected_reasons=dict(Counter(r for _, r, _ in report.rejects)),
            warnings=warnings,
        )
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return
    click.echo(
        f"hit_ratio {result.hit_ratio:.4f} ({result.hit_blocks}/{result.input_blocks} blocks) "
        f"policy {policy}/{granularity} capacity {capacity_blocks} blocks; measured "
        f"{result.measured_conversations} conversations, {result.measured_requests} requests of "
        f"{result.requests}; {report.rejected} rejected, {report.duplicates} duplicates; "
        f"simulated in {result.elapsed_s:.2f} s"
    )


def _simulate_tiers(
    file: str,
    trace: SimTrace,
    report: LoadReport,
    capacity_blocks: int,
    tiers: tuple[Tier, ...],
    tier_mode: str,
    block_size: int,
    measured: tuple[float, float],
    as_json: bool,
    load_s: float,
) -> None:
    """Run the tiered cache (``kvcast.lab.sim.tiered_cache``) and print each tier's hits."""
    names = [GPU, *(t.name for t in tiers)]
    caps = [capacity_blocks, *(t.capacity_blocks for t in tiers)]
    progress = _tty_progress if sys.stderr.isatty() else None
    start = time.perf_counter()
    served = tiered_block_hits(trace, caps, tier_mode, progress=progress)
    result: TieredResult = measure_tiers(
        trace, served, names, caps, tier_mode, *measured, elapsed_s=time.perf_counter() - start
    )
    warnings = measurement_warnings(trace, result.measured_conversations, *measured)
    for warning in warnings:
        click.echo(f"warning: {file}: {warning}", err=True)
    if as_json:
        out: dict[str, Any] = result.to_dict()
        out.update(
            file=file,
            policy="lru",
            granularity="block",
            capacity_blocks=capacity_blocks,
            block_size=block_size,
            warmup_fraction=measured[0],
            cooldown_fraction=measured[1],
            block_hashes=trace.block_hashes is not None,
            load_s=load_s,
            events={
                "processed": report.processed,
                "rejected": report.rejected,
                "duplicates": report.duplicates,
            },
            warnings=warnings,
        )
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return
    click.echo(
        f"hit_ratio {result.hit_ratio:.4f} ({result.hit_blocks}/{result.input_blocks} blocks) "
        f"policy lru/block, {tier_mode} tiers; measured {result.measured_conversations} "
        f"conversations, {result.measured_requests} requests of {result.requests}; "
        f"{report.rejected} rejected, {report.duplicates} duplicates; simulated in "
        f"{result.elapsed_s:.2f} s"
    )
    for t in result.tiers:
        click.echo(
            f"  tier {t.name}: {t.capacity_blocks} blocks, hit_ratio {t.hit_ratio:.4f} "
            f"({t.hit_blocks} blocks served)"
        )
