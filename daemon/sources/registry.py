"""The event source for a URL: ``kafka://`` (a consumer group) or ``file://`` (a JSONL replay)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from kvcast.daemon.sources.base import EventSource
from kvcast.daemon.sources.replay import ReplaySource

# Kafka's own rule for topic names (kafka.common.internals.Topic).
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def kafka_topic_of(url: str) -> tuple[str, str]:
    """``(bootstrap, topic)`` of ``kafka://HOST:PORT[,HOST:PORT]/TOPIC``; ValueError naming the
    part that is wrong."""
    parts = urlsplit(url)
    topic = parts.path.strip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic:
        raise ValueError(f"source {url!r}: expected kafka://HOST:PORT/TOPIC")
    for broker in parts.netloc.split(","):
        host, _, port = broker.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"source {url!r}: broker {broker!r} is not HOST:PORT")
    if not _TOPIC.fullmatch(topic):
        raise ValueError(
            f"source {url!r}: topic {topic!r} is not a Kafka topic name "
            "(1-249 of A-Z a-z 0-9 . _ -)"
        )
    return parts.netloc, topic


def open_source(url: str, group_id: str, **kafka_options: Any) -> EventSource:
    """The source for ``url``; ValueError (saying what was expected) for anything else.

    ``kafka_options`` (security settings) go to the kafka-python consumer unchanged.
    """
    parts = urlsplit(url)
    if parts.scheme == "kafka":
        bootstrap, topic = kafka_topic_of(url)
        from kvcast.daemon.sources.kafka_source import KafkaSource

        return KafkaSource(bootstrap, topic, group_id, **kafka_options)
    if parts.scheme == "file":
        path = Path(unquote(parts.netloc + parts.path))
        if not path.is_file():
            raise ValueError(f"source {url!r}: {path} is not a readable file")
        with path.open("rb") as handle:
            lines = [line.rstrip(b"\r\n") for line in handle if line.strip()]
        return ReplaySource(lines, partition=f"file:{path.name}:0")
    raise ValueError(f"source {url!r}: expected kafka://HOST:PORT/TOPIC or file://PATH")
