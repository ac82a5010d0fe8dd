"""Event sources behind one protocol, chosen from a URL scheme.

``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` (a consumer group), ``file://PATH`` (a JSONL replay
as one partition), or the embedded sample workload when no source is configured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from kvcast.daemon.sources.base import EventSource, PartitionListener, Record
from kvcast.daemon.sources.replay import ReplaySource
from kvcast.stats.generator import generate, preset


def open_source(url: str, group_id: str, **kafka_options: Any) -> EventSource:
    """The source for ``url``; ValueError (saying what was expected) for anything else.

    ``kafka_options`` (security settings) go to the kafka-python consumer unchanged.
    """
    parts = urlsplit(url)
    if parts.scheme == "kafka":
        topic = parts.path.strip("/")
        if not parts.netloc or not topic:
            raise ValueError(f"source {url!r}: expected kafka://HOST:PORT/TOPIC")
        from kvcast.daemon.sources.kafka_source import KafkaSource

        return KafkaSource(parts.netloc, topic, group_id, **kafka_options)
    if parts.scheme == "file":
        path = Path(unquote(parts.netloc + parts.path))
        if not path.is_file():
            raise ValueError(f"source {url!r}: {path} is not a readable file")
        with path.open("rb") as handle:
            lines = [line.rstrip(b"\r\n") for line in handle if line.strip()]
        return ReplaySource(lines, partition=f"file:{path.name}:0")
    raise ValueError(f"source {url!r}: expected kafka://HOST:PORT/TOPIC or file://PATH")


def embedded_source(
    conversations: int, speedup: float, capacity_blocks: int, block_size: int, seed: int = 7
) -> ReplaySource:
    """The embedded default: a generated intent-mixed workload, replayed in accelerated time.

    ``cached_tokens`` come from a whole-content LRU of ``capacity_blocks`` blocks, so the
    observed hit ratio has something honest to be compared with.
    """
    trace = generate(
        preset("mixed"),
        lambda0=2.0,
        conversations=conversations,
        seed=seed,
        block_size=block_size,
        prompts=True,
        cached_capacity_blocks=capacity_blocks,
    )
    lines = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    return ReplaySource(lines, partition="embedded:0", speedup=speedup)


__all__ = [
    "EventSource",
    "PartitionListener",
    "Record",
    "ReplaySource",
    "embedded_source",
    "open_source",
]
