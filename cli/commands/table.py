"""``kvcast table``: print the priority table from Redis, the daemon's HTTP server or a replay."""

from __future__ import annotations

import math
import socket
import sys
import urllib.error
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import orjson

from kvcast.cli.options import pop_label_map, pop_stats_config, stats_options, taxonomy_options
from kvcast.exporters.kit.client import (
    HttpTableSource,
    RedisTableSource,
    TableSourceError,
)
from kvcast.stats.store_url import table_key

DEFAULT_HTTP = "http://127.0.0.1:9400/v1/table"  # the embedded default of `kvcast run`


def _fmt(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def format_table(doc: Mapping[str, Any], source: str) -> str:
    """The human-readable summary and one row per state, sorted by intent then turn."""
    states = sorted(doc.get("states", []), key=lambda s: (s["intent"], s["turn"]))
    defaults = doc.get("defaults", {})
    intents = sorted({s["intent"] for s in states})
    thin = sum(1 for s in states if s.get("mu") is None)
    lines = [
        f"priority table version {doc.get('version')} from {source}",
        f"  generated at event time {_fmt(doc.get('generated_at'), 3)},"
        f" window {doc.get('window_conversations', 0):,} conversations",
        f"  {len(states)} states over {len(intents)} intents;"
        f" {thin} without delay samples (mu, sigma -)",
        f"  defaults: p_continue {defaults.get('p_continue')},"
        f" median_reuse_s {defaults.get('median_reuse_s')} (for states not listed)",
        "",
        f"{'intent':<28} {'turn':>4} {'p_continue':>10} {'median_s':>9} {'mu':>7} {'sigma':>6}"
        f" {'convs':>7} {'delays':>7}",
    ]
    for s in states:
        lines.append(
            f"{s['intent'][:28]:<28} {s['turn']:>4} {_fmt(s['p_continue'], 3):>10}"
            f" {_fmt(s['median_reuse_s'], 1):>9} {_fmt(s.get('mu'), 3):>7}"
            f" {_fmt(s.get('sigma'), 3):>6} {s.get('conversations', 0):>7,}"
            f" {s.get('delay_samples', 0):>7,}"
        )
    return "\n".join(lines)


def _load(redis_url: str | None, namespace: str, http: str | None, replay: Path | None,
          config: Any, labels: dict[str, str]) -> tuple[dict[str, Any] | None, str]:  # fmt: skip
    if replay is not None:
        from kvcast.cli.replaying import replay_engine
        from kvcast.stats.table import table_document

        finished = replay_engine(replay, config, label_map=labels)
        return table_document(finished.snapshot(), config, version=1), str(replay)
    if redis_url is not None:
        try:
            source: Any = RedisTableSource(redis_url, namespace, timeout_s=5.0)
        except ValueError as exc:  # a malformed URL: one line, the password hidden
            raise click.UsageError(str(exc)) from None
        where = f"redis key {table_key(namespace)}"
    else:
        source = HttpTableSource(http or DEFAULT_HTTP, timeout_s=5.0)
        where = source.url
    try:
        return source.fetch(), where  # type: ignore[return-value]
    except TableSourceError as exc:
        raise click.ClickException(_unreachable(exc, where, redis_url is not None)) from None
    finally:
        source.close()


def _reason(error: BaseException | None) -> str | None:
    """Why nothing answered, in words (``Connection refused``), or None when something did."""
    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        error = error.reason if isinstance(error.reason, BaseException) else None
    if isinstance(error, TimeoutError | socket.timeout):
        return "no answer within 5 s"
    if isinstance(error, OSError) and not isinstance(error, urllib.error.HTTPError):
        return error.strerror or type(error).__name__
    if error is not None and type(error).__name__ in {"ConnectionError", "TimeoutError"}:
        return "not reachable"  # redis-py's own errors
    return None


def _unreachable(exc: TableSourceError, where: str, from_redis: bool) -> str:
    """One line: what did not answer, and what to start or give instead (never a raw repr)."""
    reason = _reason(exc.__context__)
    if reason is None:  # it answered, wrongly: the source's own message says how
        return str(exc)
    if from_redis:
        return (f"cannot read the table: the Redis of --redis is unreachable: {reason} ({exc});"
                " start it, or give the --redis URL the daemon was started with (its --store)"
                )  # fmt: skip
    return (f"no kvcast daemon answers at {where} ({reason}): start one with `kvcast run`"
            " (HTTP on 127.0.0.1:9400 by default), or give --http URL of a running daemon,"
            " --redis URL of its store or --replay FILE")  # fmt: skip


@click.command("table")
@click.option(
    "--redis",
    "redis_url",
    metavar="URL",
    help="Read it from Redis: redis[s]://..., redis[s]+cluster://... or redis[s]+sentinel://...",
)
@click.option(
    "--namespace",
    default="kvcast",
    show_default=True,
    envvar="KVCAST_NAMESPACE",
    show_envvar=True,
    help="With --redis: the daemon's key namespace.",
)
@click.option("--http", metavar="URL", help=f"Read it from a daemon [default: {DEFAULT_HTTP}].")
@click.option(
    "--replay",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Compute it from a request log (the statistics flags apply).",
)
@stats_options
@taxonomy_options
@click.option("--json", "as_json", is_flag=True, help="Print the table document (SPEC section 5).")
def table(
    redis_url: str | None,
    namespace: str,
    http: str | None,
    replay: Path | None,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Print the priority table: a summary and one row per (intent, turn) state.

    Exits 1 when the source does not answer or has published no table yet.
    """
    if sum(x is not None for x in (redis_url, http, replay)) > 1:
        raise click.UsageError("give one of --redis, --http, --replay")
    config = pop_stats_config(kwargs)
    labels = pop_label_map(kwargs)
    doc, where = _load(redis_url, namespace, http, replay, config, labels)
    if doc is None:
        raise click.ClickException(f"no table published yet at {where}")
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        click.echo(format_table(doc, where))
