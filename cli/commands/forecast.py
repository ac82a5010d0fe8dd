"""``kvcast forecast``: the mean-field hit-ratio forecast from given moments (SPEC sections 4, 6).

The computation lives in ``kvcast.stats.forecast``; this module parses flags and prints. A
``--from-replay FILE`` path can build its ``Forecast`` with ``forecast_from_sample`` and reuse
``emit``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click
import orjson

from kvcast.cli.delays import parse_delay_spec
from kvcast.cli.options import (
    Floats,
    Ints,
    block_size_option,
    pop_label_map,
    pop_tiers,
    taxonomy_options,
    tier_options,
)
from kvcast.cli.replaying import replay_engine
from kvcast.stats.config import StatsConfig
from kvcast.stats.delays import DelayDistribution
from kvcast.stats.forecast import Forecast, forecast_from_moments, forecast_from_sample
from kvcast.stats.tiers import GPU

NON_NEGATIVE = Floats(min=0, finite=True)
POSITIVE = Floats(min=0, min_open=True, finite=True)


def _delay(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> DelayDistribution | None:
    if value is None:
        return None
    try:
        return parse_delay_spec(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _capacities(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> list[float] | None:
    if value is None:
        return None
    out = []
    for part in value.split(","):
        try:
            c = float(part)
        except ValueError:
            raise click.BadParameter(
                f"{part.strip()!r} is not a number of blocks", ctx, param
            ) from None
        if not (math.isfinite(c) and c > 0):
            raise click.BadParameter(
                f"every capacity must be > 0 blocks, got {part.strip()}", ctx, param
            )
        out.append(c)
    return out


def _target(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not (0 < value < 1):
        raise click.BadParameter(f"must be strictly between 0 and 1, got {value}", ctx, param)
    return value


def _fmt(x: float | None, spec: str = ".4f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def render(forecast: Forecast) -> str:
    """The human-readable table."""
    f = forecast
    rows = [
        ("status", f.status),
        ("hit ratio (forecast)", f"{_fmt(f.hit_ratio)}  [{f.variant}, {f.displacement}]"),
        ("hit ratio (single class)", _fmt(f.hit_ratio_single_class)),
        ("upper bound", _fmt(f.upper_bound)),
        ("characteristic time", _fmt(f.characteristic_time_s, ".2f", " s")),
        (
            "rate per instance",
            f"{_fmt(f.lambda_per_s)} conv/s (lambda0 {_fmt(f.lambda0)}, {f.instances} instance(s))",
        ),
        ("capacity", f"{f.capacity_blocks:g} blocks x {f.block_size} tokens"),
        ("A_R / A_H_hash / E_B", f"{_fmt(f.A_R)} / {_fmt(f.A_H_hash)} / {_fmt(f.E_B)} blocks"),
        ("delay", f.delay or "n/a"),
    ]
    if f.observed_hit_ratio is not None:
        rows.append(("observed hit ratio", _fmt(f.observed_hit_ratio)))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if len(f.tiers) > 1:
        total = sum(t.hit_ratio or 0.0 for t in f.tiers)
        known = all(t.hit_ratio is not None for t in f.tiers)
        lines += ["", f"{'tier':<12} {'capacity_blocks':>16} {'hit_ratio':>10}  ({f.tier_mode})"]
        for t in f.tiers:
            lines.append(f"{t.name:<12} {t.capacity_blocks:>16g} {_fmt(t.hit_ratio):>10}")
        lines.append(f"{'total':<12} {'':>16} {_fmt(total if known else None):>10}")
    if f.by_intent:
        lines += ["", f"{'intent':<34} {'share':>6} {'A_R':>8} {'hit':>7} {'upper':>7}"]
        for i in f.by_intent:
            lines.append(
                f"{i.intent:<34} {i.share:6.3f} {i.A_R:8.2f} {i.hit_ratio:7.4f} "
                f"{i.upper_bound:7.4f}"
            )
    if f.curve is not None:
        lines += ["", f"{'capacity_blocks':>16} {'hit_ratio':>10} {'T_C (s)':>10}"]
        for p in f.curve:
            lines.append(
                f"{p.capacity_blocks:>16g} {_fmt(p.hit_ratio):>10} "
                f"{_fmt(p.characteristic_time_s, '.2f'):>10}"
            )
    r = f.required_capacity
    if r is not None:
        lines.append("")
        what = (
            f"capacity for hit ratio {r.target:g}"
            if r.tier == GPU
            else f"tier {r.tier} for total hit ratio {r.target:g}"
        )
        if r.status == "already_reached":
            lines.append(f"{what}: 0 blocks (the tiers above already reach it)")
        elif r.blocks is None:
            reason = (
                " (above the hit ratio of an unlimited cache)" if r.status == "unreachable" else ""
            )
            lines.append(f"{what}: {r.status}{reason}")
        else:
            size = "" if r.bytes is None else f" ({r.bytes / 2**30:.2f} GiB, {r.bytes} bytes)"
            lines.append(f"{what}: {r.blocks} blocks{size}")
    return "\n".join(lines)


def emit(forecast: Forecast, as_json: bool) -> None:
    """Print ``forecast`` as one JSON object or as the table."""
    if as_json:
        click.echo(orjson.dumps(forecast.to_dict()).decode())
    else:
        click.echo(render(forecast))


_MOMENT_FLAGS = (
    ("lambda0", "--lambda"),
    ("a_r", "--A-R"),
    ("a_h_hash", "--A-H-hash"),
    ("e_b", "--E-B"),
    ("delay", "--delay"),
    ("capacity_blocks", "--capacity-blocks"),
)


@click.command("forecast")
@click.option(
    "--lambda",
    "lambda0",
    type=NON_NEGATIVE,
    help="Conversation arrival rate lambda0 over all instances (conversations/s).",
)
@click.option(
    "--A-R",
    "--a-r",
    "a_r",
    type=POSITIVE,
    help="Mean sum_j R_j per conversation (blocks).",
)
@click.option(
    "--A-H-hash",
    "--a-h-hash",
    "a_h_hash",
    type=NON_NEGATIVE,
    help="Mean sum_{j<M} max(R_j - 1, 0) per conversation (blocks).",
)
@click.option(
    "--E-B",
    "--e-b",
    "e_b",
    type=NON_NEGATIVE,
    help="Mean final-turn block count R_M (blocks).",
)
@click.option(
    "--A-H",
    "--a-h",
    "a_h",
    type=NON_NEGATIVE,
    help="Mean sum_{j<M} R_j (blocks); needed for --displacement whole.",
)
@click.option("--E-M", "--e-m", "e_m", type=NON_NEGATIVE, help="Mean turns (reported only).")
@click.option(
    "--delay",
    callback=_delay,
    metavar="exp:MEAN_S|lognormal:MU,SIGMA|FILE",
    help="Inter-turn delay distribution F (seconds; lognormal in log seconds).",
)
@click.option(
    "--displacement",
    type=click.Choice(["hashable", "whole"]),
    default="hashable",
    show_default=True,
    help="What a revisit moves to MRU: hashable blocks or all.",
)
@click.option("--capacity-blocks", type=POSITIVE, help="HBM capacity per instance (blocks).")
@block_size_option
@click.option(
    "--instances",
    type=Ints(min=1),
    default=1,
    show_default=True,
    help="Instances behind session-affine routing (each sees lambda0 / instances).",
)
@click.option(
    "--capacities",
    callback=_capacities,
    metavar="A,B,C",
    help="Also print the curve h(N) at these capacities (blocks).",
)
@click.option(
    "--target-hit-ratio",
    "--target",
    "target_hit_ratio",
    type=float,
    callback=_target,
    help="Also print the capacity needed for this hit ratio (0 < x < 1); with --tier-for, "
    "the total hit ratio of the stack.",
)
@tier_options
@click.option(
    "--tier-for",
    default=GPU,
    show_default=True,
    metavar="NAME",
    help="The tier --target plans: its capacity for the total hit ratio, given the tiers above "
    "it (gpu: the whole cache, the tiers below ignored).",
)
@click.option(
    "--kv-bytes-per-token",
    type=POSITIVE,
    help="KV cache bytes per token, to give the needed capacity in bytes.",
)
@click.option(
    "--from-replay",
    "from_replay",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take the moments and delays from this JSONL request log instead of the flags.",
)
@taxonomy_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def forecast(
    lambda0: float | None,
    a_r: float | None,
    a_h_hash: float | None,
    e_b: float | None,
    a_h: float | None,
    e_m: float | None,
    delay: DelayDistribution | None,
    displacement: str,
    capacity_blocks: float | None,
    block_size: int,
    instances: int,
    capacities: list[float] | None,
    target_hit_ratio: float | None,
    kv_bytes_per_token: float | None,
    from_replay: Path | None,
    as_json: bool,
    tier_for: str,
    **taxonomy: Any,
) -> None:
    """Forecast the prefix-cache hit ratio from workload moments (mean-field LRU), or from the
    statistics of a request log (--from-replay); per tier with --tier."""
    ctx = click.get_current_context()
    tiers, tier_mode = pop_tiers(taxonomy, capacity_blocks or 1.0)
    names = [GPU, *(t.name for t in tiers)]
    if tier_for not in names:
        raise click.BadParameter(
            f"{tier_for!r} is not a tier of the stack ({', '.join(names)}); give it with "
            f"--tier {tier_for}=BLOCKS (the planner ignores its capacity)",
            ctx,
            param_hint="'--tier-for'",
        )
    if tier_for != GPU and target_hit_ratio is None:
        raise click.UsageError("--tier-for needs --target (the total hit ratio to plan for)", ctx)
    tiered: dict[str, Any] = dict(tiers=tiers, tier_mode=tier_mode, target_tier=tier_for)
    if from_replay is not None:
        if capacity_blocks is None:
            raise click.UsageError("missing --capacity-blocks", ctx)
        finished = replay_engine(
            from_replay, StatsConfig(block_size=block_size), label_map=pop_label_map(taxonomy)
        )
        result = forecast_from_sample(
            finished.snapshot().sample,
            capacity_blocks=capacity_blocks,
            block_size=block_size,
            instances=instances,
            capacities=capacities,
            target=target_hit_ratio,
            kv_bytes_per_token=kv_bytes_per_token,
            **tiered,
        )
        emit(result, as_json)
        return
    values = {
        "lambda0": lambda0,
        "a_r": a_r,
        "a_h_hash": a_h_hash,
        "e_b": e_b,
        "delay": delay,
        "capacity_blocks": capacity_blocks,
    }
    missing = [flag for key, flag in _MOMENT_FLAGS if values[key] is None]
    if missing:
        raise click.UsageError(
            f"missing {', '.join(missing)} (needed to forecast from moments)", ctx
        )
    assert a_r is not None and a_h_hash is not None and e_b is not None
    assert delay is not None and capacity_blocks is not None
    if a_h_hash > a_r:
        raise click.BadParameter(
            f"A_H_hash ({a_h_hash}) cannot exceed A_R ({a_r})", ctx, param_hint="'--A-H-hash'"
        )
    if displacement == "whole" and a_h is None:
        raise click.BadParameter("--displacement whole needs --A-H", ctx, param_hint="'--A-H'")
    try:
        result = forecast_from_moments(
            lambda0=lambda0,
            A_R=a_r,
            A_H_hash=a_h_hash,
            E_B=e_b,
            delay=delay,
            capacity_blocks=capacity_blocks,
            block_size=block_size,
            instances=instances,
            A_H=a_h,
            E_M=e_m,
            displacement=displacement,
            capacities=capacities,
            target=target_hit_ratio,
            kv_bytes_per_token=kv_bytes_per_token,
            **tiered,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc), ctx) from None
    emit(result, as_json)
