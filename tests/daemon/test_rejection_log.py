"""Rejected events are logged by position, reason and field, rate-limited, without payloads."""

from __future__ import annotations

import logging

import pytest

from kvcast.daemon.rejection_log import RejectionLog
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.stats.engine import Rejection
from tests.daemon.test_runner import make_daemon, run_until_flushed


class Clock:
    now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_the_first_lines_of_a_window_are_logged_and_the_rest_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = RejectionLog(logging.getLogger("kvcast.test"), lines=2, window_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="kvcast.test"):
        log.note("events:0", Rejection(41, "wrong_type", "turn"))
        log.note("events:1", Rejection(7, "invalid_json", None))
        for offset in range(5):
            log.note("events:0", Rejection(50 + offset, "too_late", "timestamp"))
        clock.now_s = 61.0
        log.note("events:0", Rejection(99, "future", "timestamp"))
    assert caplog.messages == [
        "rejected event at events:0:41: wrong_type (field turn)",
        "rejected event at events:1:7: invalid_json",
        "5 more rejected events not logged in 60 s (kvcast_events_rejected_total counts them all)",
        "rejected event at events:0:99: future (field timestamp)",
    ]


def test_the_daemon_logs_where_a_rejected_event_was(caplog: pytest.LogCaptureFixture) -> None:
    good = b'{"session_id":"a","turn":1,"timestamp":1,"input_tokens":5,"output_tokens":1}'
    secret = b'{"session_id":"a","turn":"my secret","timestamp":2,"input_tokens":5}'
    daemon, source, _ = make_daemon(MemoryStore(), [good, b"{oops", secret, good])
    with caplog.at_level(logging.WARNING, logger="kvcast.daemon.runner"):
        assert run_until_flushed(daemon, source) == 0
    lines = [m for m in caplog.messages if m.startswith("rejected event")]
    assert lines == [
        "rejected event at p:0:1: invalid_json",
        "rejected event at p:0:2: wrong_type (field turn)",
    ]
    assert "secret" not in caplog.text
