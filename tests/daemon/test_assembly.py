"""The daemon assembled from its settings (``kvcast.daemon.assembly``), without the CLI."""

from __future__ import annotations

import dataclasses
import signal
import socket
from pathlib import Path

import orjson
import pytest

from kvcast.daemon import assembly
from kvcast.daemon.assembly import AssemblyError, StopSignals, capacity_from_engines, run_daemon
from kvcast.daemon.settings import DaemonSettings


def _no_embedded(_settings: DaemonSettings) -> None:
    raise AssertionError("a file:// source needs no embedded workload")


def test_a_signal_during_assembly_drains_and_exits_0_with_the_daemon_s_own_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM while the parts are still being built: HTTP comes up, the loop starts, stops at
    once, stores what it applied, and the process says so (exit 0, not 143)."""
    events = tmp_path / "events.jsonl"
    lines = [
        {"session_id": f"s{n}", "turn": 1, "timestamp": 1.0 + n, "input_tokens": 10,
         "output_tokens": 5, "intent": "coding"}
        for n in range(3)
    ]  # fmt: skip
    events.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    settings = DaemonSettings(
        source=f"file://{events}", metrics_addr="127.0.0.1:0", classifier="off",
        status_interval_s=60,
    )  # fmt: skip
    signals = StopSignals()
    signals._handle(signal.SIGTERM)  # as the handler does when the signal comes
    code = run_daemon(settings, _no_embedded, signals=signals)
    err = capsys.readouterr().err
    assert code == 0
    assert f"kvcast: source file://{events}, store memory://, serving http://127.0.0.1:" in err
    assert "kvcast: stopped on SIGTERM: " in err and " events applied, everything stored" in err


def test_a_source_that_cannot_be_opened_is_an_assembly_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    settings = DaemonSettings(source=f"file://{missing}", metrics_addr="127.0.0.1:0")
    with pytest.raises(AssemblyError, match=f"{missing} is not a readable file"):
        run_daemon(settings, _no_embedded, signals=StopSignals())


def test_an_address_in_use_is_an_assembly_error_naming_the_flag(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        settings = DaemonSettings(source=f"file://{events}", metrics_addr=address)
        with pytest.raises(AssemblyError, match=f"^--metrics-addr {address}: "):
            run_daemon(settings, _no_embedded, signals=StopSignals())


def test_a_signal_before_the_loop_exists_stops_it_as_soon_as_it_is_attached() -> None:
    signals = StopSignals()
    signals._handle(signal.SIGTERM)
    stopped: list[str] = []
    signals.attach(lambda: stopped.append("stop"))
    assert stopped == ["stop"] and signals.received == ["SIGTERM"]
    signals._handle(signal.SIGINT)
    assert stopped == ["stop", "stop"]


def test_the_engines_fill_only_what_no_layer_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, ...]] = []

    def engine_capacity(urls: tuple[str, ...]) -> tuple[int, int, int]:
        asked.append(urls)
        return 9000, 32, 4

    monkeypatch.setattr(assembly, "engine_capacity", engine_capacity)
    plain = DaemonSettings()
    assert capacity_from_engines(plain, given=()) is plain and asked == []  # no endpoints
    engines = DaemonSettings(engine_metrics=("http://vllm:8000/metrics",))
    assert capacity_from_engines(engines, {"capacity_blocks", "block_size"}) is engines
    assert asked == []  # both given: the engines are not asked
    taken = capacity_from_engines(engines, {"capacity_blocks"})
    assert asked == [("http://vllm:8000/metrics",)]
    assert (taken.capacity_blocks, taken.stats.block_size, taken.instances) == (2275, 32, 4)
    assert taken == dataclasses.replace(
        engines, stats=dataclasses.replace(engines.stats, block_size=32), instances=4
    )
