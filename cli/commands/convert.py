"""``kvcast convert --format mooncake|bailian|sharegpt IN OUT.jsonl``: public traces to events."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import click
import orjson

from kvcast.lab.traces import (
    FORMATS,
    MATCH_MODES,
    TraceError,
    convert_bailian,
    convert_mooncake,
    convert_sharegpt,
)

_PROGRESS_EVERY = 100_000  # lines


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        click.echo(f"\r{message}", err=True, nl=False)


def read_records(path: str) -> Iterator[tuple[int, Any]]:
    """``(line, object)`` for each non-blank line of a JSONL file, or ``(item, object)`` for each
    item of a file holding one JSON array; raises :class:`TraceError` on invalid JSON."""
    with open(path, "rb") as fh:
        head = fh.read(64).lstrip()
        fh.seek(0)
        if head.startswith(b"["):
            try:
                items = orjson.loads(fh.read())
            except orjson.JSONDecodeError as exc:
                raise TraceError(1, f"not valid JSON ({exc})") from None
            yield from enumerate(items, 1)
            return
        for line, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise TraceError(line, f"not valid JSON ({exc})") from None
            if line % _PROGRESS_EVERY == 0:
                _progress(f"read {line:,} lines")
            yield line, obj


@click.command("convert")
@click.option(
    "--format", "fmt", type=click.Choice(FORMATS), required=True, help="Input trace format."
)
@click.argument("src", metavar="IN", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst", metavar="OUT.jsonl", type=click.Path(dir_okay=False, writable=True))
@click.option(
    "--match",
    type=click.Choice(MATCH_MODES),
    default="hashable",
    show_default=True,
    help="mooncake: hashable = an earlier request's ids form a prefix but for its partial last "
    "block, which the next turn re-hashes (finds 6x the continuations of full on the Mooncake "
    "synthetic trace); full = all its ids (SPEC's literal rule).",
)
@click.option(
    "--rate",
    type=float,
    default=1.0,
    show_default=True,
    help="sharegpt: new conversations per second (Poisson).",
)
@click.option(
    "--delay-mu",
    type=float,
    default=4.6,
    show_default=True,
    help="sharegpt: mean of log inter-turn delay (log seconds).",
)
@click.option(
    "--delay-sigma",
    type=float,
    default=1.0,
    show_default=True,
    help="sharegpt: std of log inter-turn delay (log seconds).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="sharegpt: random seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def convert_command(
    fmt: str,
    src: str,
    dst: str,
    match: str,
    rate: float,
    delay_mu: float,
    delay_sigma: float,
    seed: int,
    as_json: bool,
) -> None:
    """Convert a public trace IN into contract events (SPEC section 2), one per line of
    OUT.jsonl, in timestamp order. Mooncake conversations are recovered from hash_ids
    prefix chains; block_hashes are kept where the trace has them."""
    if fmt == "sharegpt" and not (rate > 0 and delay_sigma > 0):
        raise click.UsageError("--rate and --delay-sigma must be > 0")
    try:
        records = read_records(src)
        if fmt == "mooncake":
            events, summary = convert_mooncake(records, match=match)
        elif fmt == "bailian":
            events, summary = convert_bailian(records)
        else:
            events, summary = convert_sharegpt(
                records, rate=rate, mu=delay_mu, sigma=delay_sigma, seed=seed
            )
    except TraceError as exc:
        _progress("")
        raise click.ClickException(f"{src}:{exc.line}: {exc.message}") from None
    with open(dst, "wb") as out:
        for k, ev in enumerate(events, 1):
            out.write(orjson.dumps(ev) + b"\n")
            if k % _PROGRESS_EVERY == 0:
                _progress(f"wrote {k:,} events")
    _progress("")
    doc = {"input": src, "output": dst, **summary.to_dict()}
    if as_json:
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return
    click.echo(
        f"{summary.events} events from {summary.records} {fmt} records: "
        f"{summary.conversations} conversations ({summary.multi_turn_conversations} with 2+ "
        f"turns, up to {summary.max_turn} turns); {summary.skipped} skipped -> {dst}"
    )
