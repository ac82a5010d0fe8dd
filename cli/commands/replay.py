"""``kvcast replay FILE.jsonl``: a request log through the full pipeline, as fast as it goes."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click
import orjson

from kvcast.cli.options import capacity_options, pop_stats_config, stats_options
from kvcast.cli.report import format_replay_report
from kvcast.daemon.gc_tuning import tune_for_streaming
from kvcast.daemon.sources.replay import read_line_batches
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.native.replay import native_available
from kvcast.stats.priority import table_document
from kvcast.stats.replay import ReplayEngineName, ReplayProgress, replay_lines

PROGRESS_INTERVAL_S = 0.5


def replay_engine(
    path: Path,
    config: StatsConfig,
    progress: TextIO | None = None,
    engine: ReplayEngineName = "auto",
) -> StatsEngine:
    """Run every line of ``path`` through the statistics and finish them (all conversations
    complete). Progress lines go to ``progress`` when given."""
    started = time.monotonic()
    last_report = -math.inf
    last: ReplayProgress | None = None

    def report(now: ReplayProgress) -> None:
        nonlocal last_report, last
        last = now
        if progress is not None and time.monotonic() - last_report >= PROGRESS_INTERVAL_S:
            last_report = time.monotonic()
            _progress_line(progress, now, last_report - started)

    finished = replay_lines(lambda: read_line_batches(path), config, engine=engine, on_batch=report)
    if progress is not None:
        if last is not None:
            _progress_line(progress, last, time.monotonic() - started)
        progress.write("\n")
    return finished


def replay_file(
    path: Path,
    config: StatsConfig,
    *,
    capacity_blocks: int,
    instances: int = 1,
    kv_bytes_per_token: int | None = None,
    progress: TextIO | None = None,
    engine: ReplayEngineName = "auto",
) -> dict[str, Any]:
    """Replay a JSONL file; return ``{"forecast", "table", "events"}`` (SPEC section 6)."""
    finished = replay_engine(path, config, progress, engine)
    snapshot = finished.snapshot()
    forecast = forecast_from_sample(
        snapshot.sample,
        capacity_blocks=capacity_blocks,
        block_size=config.block_size,
        instances=instances,
        kv_bytes_per_token=kv_bytes_per_token,
    )
    events = finished.counters.to_dict()
    events["open_conversations"] = finished.tracker.open_conversations
    return {
        "forecast": forecast.to_dict(),
        "table": table_document(snapshot, config, version=1),
        "events": events,
    }


def _progress_line(stream: TextIO, now: ReplayProgress, elapsed_s: float) -> None:
    rate = now.offered / elapsed_s if elapsed_s > 0 else 0.0
    stream.write(
        f"\r{now.offered:,} events  {rate:,.0f} events/s  "
        f"rejected {now.rejected:,}  duplicates {now.duplicates:,}  ({now.engine} engine)"
    )
    stream.flush()


@click.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@stats_options
@capacity_options
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (forecast, table, events)."
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "native", "python"]),
    default="auto",
    show_default=True,
    help="Statistics engine: native (in C, the same numbers, several times faster), python "
    "(the daemon's own, per event), auto (native when it was built).",
)
def replay(file: Path, as_json: bool, engine: ReplayEngineName, **kwargs: Any) -> None:
    """Run FILE (one event per line) through the pipeline; print forecast, table and counters.

    On a terminal, progress goes to standard error; standard output holds only the result.
    """
    config = pop_stats_config(kwargs)
    tune_for_streaming()
    show_progress = not as_json and sys.stderr.isatty()
    if engine == "native" and not native_available():
        raise click.UsageError(
            "--engine native: the native replay engine is not built (reinstall kvcast with a C "
            "compiler at hand, or use --engine python)"
        )
    result = replay_file(
        file,
        config,
        capacity_blocks=kwargs["capacity_blocks"],
        instances=kwargs["instances"],
        kv_bytes_per_token=kwargs["kv_bytes_per_token"],
        progress=sys.stderr if show_progress else None,
        engine=engine,
    )
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        click.echo(format_replay_report(result))
