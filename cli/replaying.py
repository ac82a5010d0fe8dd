"""A JSONL file through the statistics, with a progress line: shared by ``replay``,
``forecast --from-replay`` and ``table --replay``."""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import click
import orjson

from kvcast.daemon.sources.replay import file_line, read_line_batches
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.replay import ReplayEngineName, ReplayProgress, replay_lines
from kvcast.stats.table import table_document

PROGRESS_INTERVAL_S = 0.5
SNIFF_BYTES = 1 << 20  # the first line is looked at, up to 1 MiB of it

# Public traces `kvcast convert` knows, by the fields of one record (lab/traces/): the format,
# the fields that say so, a field that says it is another format, and the tokens per hash block
# (the --block-size that replays the converted events as the trace's hashes mean them).
FOREIGN_FORMATS = (
    ("bailian", "Qwen-Bailian's", ("chat_id", "parent_chat_id", "input_length", "hash_ids"), None,
     16),
    ("mooncake", "Mooncake's", ("timestamp", "input_length", "output_length", "hash_ids"),
     "chat_id", 512),
)  # fmt: skip


def foreign_format(path: Path) -> tuple[str, str, int | None] | None:
    """``(format, its name, tokens per hash block)`` when ``path`` is a public trace in its own
    format rather than kvcast events (its first record decides), else None."""
    with path.open("rb") as stream:
        head = stream.read(SNIFF_BYTES)
    text = head.lstrip()
    if text.startswith(b"[") and b'"conversations"' in text:  # ShareGPT: one JSON array
        return "sharegpt", "ShareGPT's", None
    first = text.split(b"\n", 1)[0]
    try:
        record = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or "session_id" in record:
        return None
    for name, label, fields, other, block in FOREIGN_FORMATS:
        if all(field in record for field in fields) and (other is None or other not in record):
            return name, label, block
    return None


def refuse_foreign_format(path: Path) -> None:
    """A public trace given where events are expected: say which ``kvcast convert`` to run."""
    found = foreign_format(path)
    if found is None:
        return
    name, label, block = found
    out = path.with_name(f"{path.stem}.events.jsonl")
    convert = f"kvcast convert --format {name} {shlex.quote(str(path))} {shlex.quote(str(out))}"
    then = f"kvcast replay {shlex.quote(str(out))}"
    if block is not None and block != 16:
        then += f" --block-size {block}  (its hash_ids are {block}-token blocks)"
    raise click.ClickException(
        f"{path} is a trace in {label} format, not kvcast events (no session_id; see"
        f" docs/events.md). Convert it, then replay what convert wrote:\n  {convert}\n  {then}"
    )


def all_rejected(events: Mapping[str, Any], path: Path) -> str | None:
    """The summary line when not one line of ``path`` was accepted, else None."""
    rejected = int(events.get("rejected", 0))
    if events.get("processed", 0) or not rejected:
        return None
    fields: dict[tuple[str, str | None], int] = {}
    for kept in events.get("rejections", []):
        key = (kept["reason"], kept.get("field"))
        fields[key] = fields.get(key, 0) + 1
    (reason, field), _ = max(fields.items(), key=lambda item: item[1])
    by_reason = ", ".join(
        f"{r} {n:,}" for r, n in sorted(events.get("rejected_by_reason", {}).items())
    )
    first = f"{reason} {field}" if field else reason
    return (
        f"every one of the {rejected:,} lines of {path} was rejected ({by_reason}; the most common:"
        f" {first}), so nothing was counted: the event contract is in docs/events.md"
    )


def replay_engine(
    path: Path,
    config: StatsConfig,
    progress: TextIO | None = None,
    engine: ReplayEngineName = "auto",
    label_map: Mapping[str, str] | None = None,
) -> StatsEngine:
    """Run every line of ``path`` through the statistics and finish them (all conversations
    complete). Progress lines go to ``progress`` when given; ``label_map``: the taxonomy's
    producer label -> state label (default: the 30 categories). The rejections kept
    (``engine.rejections``) come back with the file's 1-based line numbers as positions. A
    public trace in its own format is refused with the ``kvcast convert`` line to run."""
    refuse_foreign_format(path)
    started = time.monotonic()
    blank_lines: list[int] = []

    def open_batches() -> Iterable[list[bytes]]:
        blank_lines.clear()  # called again from the start when the engine changes
        return read_line_batches(path, blank_lines)

    last_report = -math.inf
    last: ReplayProgress | None = None

    def report(now: ReplayProgress) -> None:
        nonlocal last_report, last
        last = now
        if progress is not None and time.monotonic() - last_report >= PROGRESS_INTERVAL_S:
            last_report = time.monotonic()
            _progress_line(progress, now, last_report - started)

    finished = replay_lines(
        open_batches,
        config,
        engine=engine,
        on_batch=report,
        label_map=label_map,
    )
    if progress is not None:
        if last is not None:
            _progress_line(progress, last, time.monotonic() - started)
        progress.write("\n")
    finished.rejections = [
        kept._replace(position=file_line(kept.position, blank_lines))
        for kept in finished.rejections
    ]
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
    label_map: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Replay a JSONL file; return ``{"forecast", "table", "events"}`` (SPEC section 6)."""
    finished = replay_engine(path, config, progress, engine, label_map)
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
    events["rejections"] = [
        {"position": kept.position, "reason": kept.reason, "field": kept.field}
        for kept in finished.rejections
    ]
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
