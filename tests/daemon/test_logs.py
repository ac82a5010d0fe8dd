"""``--log-format json``: one JSON object per log line, with the fields a pipeline keys on."""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
from pathlib import Path

import pytest

from kvcast.daemon.logs import JsonFormatter, LogConfig
from kvcast.lab.bench.processes import DaemonProcess, wait_until

TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def record(message: str, *args: object, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("kvcast.daemon.runner", logging.WARNING, __file__, 1, message,
                             args, exc_info)  # fmt: skip


def test_a_record_becomes_one_json_object_with_time_level_logger_message_pid() -> None:
    line = JsonFormatter().format(record("store unavailable (%s)", "timeout"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert set(parsed) == {"time", "level", "logger", "message", "pid"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", parsed["time"])
    assert (parsed["level"], parsed["logger"]) == ("warning", "kvcast.daemon.runner")
    assert parsed["message"] == "store unavailable (timeout)"


def test_a_worker_and_a_traceback_are_fields_of_their_own() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        line = JsonFormatter(worker=3).format(record("refresh failed", exc_info=sys.exc_info()))
    parsed = json.loads(line)
    assert parsed["worker"] == 3
    assert "RuntimeError: boom" in parsed["exception"] and "\n" not in line


def test_bad_levels_and_formats_are_named() -> None:
    with pytest.raises(ValueError, match="log format 'xml': expected text or json"):
        LogConfig("info", "xml")
    with pytest.raises(ValueError, match="log level 'loud'"):
        LogConfig("loud")


def test_kvcast_run_logs_json_lines_only(tmp_path: Path) -> None:
    daemon = DaemonProcess(
        ["--log-format", "json", "--json", "--metrics-addr", "127.0.0.1:0",
         "--sample-conversations", "200", "--status-interval", "0.5"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        wait_until(lambda: '"events_per_s"' in daemon.text(), 30, "a status line")
    finally:
        assert daemon.stop(signal.SIGTERM) == 0
    records, others = [], []
    for line in daemon.text().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
        else:
            others.append(line)
    assert not any(TEXT_RECORD.match(line) for line in others), others
    logged = [r for r in records if "logger" in r]
    assert {"time", "level", "logger", "message", "pid"} <= set(logged[0])
    assert any(r["logger"] == "kvcast.exporters.http_server" for r in logged)
