"""How kvcast's processes log: plain lines for people, or one JSON object per line for a log
pipeline (``--log-format json``).

A JSON line carries ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``,
``message``, ``pid``, ``worker`` (the index of a ``--workers`` process; absent in the primary)
and, with a traceback, ``exception``. Standard library and orjson only.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import orjson

__all__ = ["LOG_FORMATS", "JsonFormatter", "LogConfig"]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process or os.getpid(),
        }
        if self.worker is not None:
            line["worker"] = self.worker
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


@dataclass(frozen=True)
class LogConfig:
    """``level``: debug, info, warning or error; ``format``: text or json."""

    level: str = "info"
    format: str = "text"

    def __post_init__(self) -> None:
        if self.level not in LOG_LEVELS:
            raise ValueError(f"log level {self.level!r}: expected one of {', '.join(LOG_LEVELS)}")
        if self.format not in LOG_FORMATS:
            raise ValueError(f"log format {self.format!r}: expected text or json")

    def configure(self, worker: int | None = None) -> None:
        """Set up the root logger once per process (like ``logging.basicConfig``, a process
        that has handlers already keeps them). kafka-python's debug log dumps raw fetch
        responses, the events' user text: it never goes below info."""
        handler = logging.StreamHandler()
        if self.format == "json":
            handler.setFormatter(JsonFormatter(worker))
        else:
            who = "" if worker is None else f"worker {worker} "
            handler.setFormatter(
                logging.Formatter(f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s")
            )
        level = logging.getLevelName(self.level.upper())
        logging.basicConfig(level=level, handlers=[handler])
        logging.getLogger("kafka").setLevel(max(logging.INFO, level))
