"""The event source for a URL: ``kafka://`` (a consumer group) or ``file://`` (a JSONL replay)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from kvcast.daemon.sources.base import EventSource
from kvcast.daemon.sources.replay import ReplaySource
from kvcast.producer.kafka import kafka_topic_of


def open_source(
    url: str, group_id: str, assignment: str = "cooperative-sticky", **kafka_options: Any
) -> EventSource:
    """The source for ``url``; ValueError (saying what was expected) for anything else.

    ``kafka_options`` (security settings) go to the kafka-python consumer unchanged.
    """
    parts = urlsplit(url)
    if parts.scheme == "kafka":
        bootstrap, topic = kafka_topic_of(url)
        from kvcast.daemon.sources.kafka_source import KafkaSource

        return KafkaSource(bootstrap, topic, group_id, assignment, **kafka_options)
    if parts.scheme == "file":
        path = Path(unquote(parts.netloc + parts.path))
        if not path.is_file():
            raise ValueError(f"source {url!r}: {path} is not a readable file")
        with path.open("rb") as handle:
            lines = [line.rstrip(b"\r\n") for line in handle if line.strip()]
        return ReplaySource(lines, partition=f"file:{path.name}:0")
    raise ValueError(f"source {url!r}: expected kafka://HOST:PORT/TOPIC or file://PATH")
