"""Event sources behind one protocol, chosen from a URL scheme.

``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` (a consumer group) or ``file://PATH`` (a JSONL replay
as one partition). The embedded default's sample workload is built by the CLI
(``kvcast.cli.demo``) and handed in as a :class:`ReplaySource`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from kvcast.daemon.sources.base import EventSource, PartitionListener, Record
from kvcast.daemon.sources.replay import ReplaySource


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


__all__ = [
    "EventSource",
    "PartitionListener",
    "Record",
    "ReplaySource",
    "open_source",
]
