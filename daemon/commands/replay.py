"""``kvcast replay FILE.jsonl``: a request log through the full pipeline, as fast as it goes."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click
import orjson

from kvcast.daemon.gc_tuning import tune_for_streaming
from kvcast.daemon.options import capacity_options, pop_stats_config, stats_options
from kvcast.daemon.pipeline import Pipeline, read_lines
from kvcast.daemon.report import format_replay_report
from kvcast.stats.config import StatsConfig
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.table import table_document

PROGRESS_INTERVAL_S = 0.5


def replay_pipeline(path: Path, config: StatsConfig, progress: TextIO | None = None) -> Pipeline:
    """Run every line of ``path`` through a fresh pipeline and finish it (all conversations
    complete). Progress lines go to ``progress`` when given."""
    pipeline = Pipeline(config)
    started = last_report = time.monotonic()
    offered = 0
    for line in read_lines(path):
        pipeline.offer(line)
        offered += 1
        if progress is not None and offered % 4096 == 0:
            now = time.monotonic()
            if now - last_report >= PROGRESS_INTERVAL_S:
                last_report = now
                _progress_line(progress, pipeline, offered, now - started)
    pipeline.engine.finish()
    if progress is not None:
        _progress_line(progress, pipeline, offered, time.monotonic() - started)
        progress.write("\n")
    return pipeline


def replay_file(
    path: Path,
    config: StatsConfig,
    *,
    capacity_blocks: int,
    instances: int = 1,
    kv_bytes_per_token: int | None = None,
    progress: TextIO | None = None,
) -> dict[str, Any]:
    """Replay a JSONL file; return ``{"forecast", "table", "events"}`` (SPEC section 6)."""
    pipeline = replay_pipeline(path, config, progress)
    snapshot = pipeline.engine.snapshot()
    forecast = forecast_from_sample(
        snapshot.sample,
        capacity_blocks=capacity_blocks,
        block_size=config.block_size,
        instances=instances,
        kv_bytes_per_token=kv_bytes_per_token,
    )
    events = pipeline.engine.counters.to_dict()
    events["open_conversations"] = pipeline.engine.tracker.open_conversations
    return {
        "forecast": forecast.to_dict(),
        "table": table_document(snapshot, config, version=1),
        "events": events,
    }


def _progress_line(stream: TextIO, pipeline: Pipeline, offered: int, elapsed_s: float) -> None:
    counters = pipeline.engine.counters
    rate = offered / elapsed_s if elapsed_s > 0 else 0.0
    stream.write(
        f"\r{offered:,} events  {rate:,.0f} events/s  "
        f"rejected {sum(counters.rejected.values()):,}  duplicates {counters.duplicates:,}"
    )
    stream.flush()


@click.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@stats_options
@capacity_options
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (forecast, table, events)."
)
def replay(file: Path, as_json: bool, **kwargs: Any) -> None:
    """Run FILE (one event per line) through the pipeline; print forecast, table and counters.

    On a terminal, progress goes to standard error; standard output holds only the result.
    """
    config = pop_stats_config(kwargs)
    tune_for_streaming()
    show_progress = not as_json and sys.stderr.isatty()
    result = replay_file(
        file,
        config,
        capacity_blocks=kwargs["capacity_blocks"],
        instances=kwargs["instances"],
        kv_bytes_per_token=kwargs["kv_bytes_per_token"],
        progress=sys.stderr if show_progress else None,
    )
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        click.echo(format_replay_report(result))
