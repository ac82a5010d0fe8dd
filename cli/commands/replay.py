"""``kvcast replay FILE.jsonl``: a request log through the full pipeline, as fast as it goes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from kvcast.cli.options import (
    capacity_options,
    pop_label_map,
    pop_stats_config,
    stats_options,
    taxonomy_options,
)
from kvcast.cli.replaying import all_rejected, replay_file
from kvcast.cli.report import format_replay_report
from kvcast.daemon.gc_tuning import tune_for_streaming
from kvcast.stats.native.replay import native_available
from kvcast.stats.replay import ReplayEngineName


@click.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@stats_options
@capacity_options
@taxonomy_options
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
    Exits 1 when FILE is a public trace in its own format (the message names the ``kvcast
    convert`` line to run) or when every line of it was rejected.
    """
    config = pop_stats_config(kwargs)
    labels = pop_label_map(kwargs)
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
        label_map=labels,
    )
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        click.echo(format_replay_report(result))
    summary = all_rejected(result["events"], file)
    if summary is not None:  # the report is printed, but a file of nothing is not a success
        raise click.ClickException(summary)
