"""A JSONL file through the statistics, with a progress line: shared by ``replay``,
``forecast --from-replay`` and ``table --replay``."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from kvcast.daemon.sources.replay import file_line, read_line_batches
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.priority import table_document
from kvcast.stats.replay import ReplayEngineName, ReplayProgress, replay_lines

PROGRESS_INTERVAL_S = 0.5


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
    (``engine.rejections``) come back with the file's 1-based line numbers as positions."""
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
