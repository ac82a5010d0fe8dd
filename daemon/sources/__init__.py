"""Event sources behind one protocol, chosen from a URL scheme.

``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` (a consumer group) or ``file://PATH`` (a JSONL replay
as one partition). The embedded default's sample workload is built by the CLI
(``kvcast.cli.demo``) and handed in as a :class:`ReplaySource`.
"""

from kvcast.daemon.sources.base import EventSource, PartitionListener, Record
from kvcast.daemon.sources.registry import open_source
from kvcast.daemon.sources.replay import ReplaySource

__all__ = [
    "EventSource",
    "PartitionListener",
    "Record",
    "ReplaySource",
    "open_source",
]
