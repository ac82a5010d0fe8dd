"""``kvcast replay``: the SPEC section 6 JSON shape, human output, and bad input."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from tests.support import require_native

FORECAST_KEYS = {
    "hit_ratio",
    "hit_ratio_single_class",
    "upper_bound",
    "characteristic_time_s",
    "lambda_per_s",
    "A_R",
    "A_H_hash",
    "E_B",
    "E_M",
    "capacity_blocks",
    "block_size",
    "instances",
    "by_intent",
}
STATE_KEYS = {
    "intent",
    "turn",
    "p_continue",
    "median_reuse_s",
    "mu",
    "sigma",
    "conversations",
    "delay_samples",
}


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "events.jsonl"
    trace = generate(preset("mixed"), lambda0=1.0, conversations=600, seed=3)
    lines = [line.strip() for line in trace.jsonl_lines()]
    lines[5:5] = [b"{broken", b'{"session_id": "x", "turn": 0}', lines[7], b""]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_json_output_has_the_contract_keys(log_file: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", str(log_file), "--json"])
    assert result.exit_code == 0, result.output
    body = orjson.loads(result.stdout)
    assert set(body) == {"forecast", "table", "events"}
    assert set(body["forecast"]) >= FORECAST_KEYS
    assert body["forecast"]["status"] == "ok"
    assert 0 < body["forecast"]["hit_ratio"] <= body["forecast"]["upper_bound"] < 1
    table = body["table"]
    assert {"version", "generated_at", "window_conversations", "defaults", "states"} <= set(table)
    assert table["defaults"] == {"p_continue": 0.5, "median_reuse_s": 150.0}
    assert all(set(state) == STATE_KEYS for state in table["states"])
    events = body["events"]
    assert events["rejected"] == 2 and events["duplicates"] == 1
    assert events["rejected_by_reason"] == {"invalid_json": 1, "out_of_range": 1}
    assert events["processed"] == sum(1 for line in log_file.open() if line.strip()) - 3


def test_flags_change_the_statistics(log_file: Path) -> None:
    def run(*flags: str) -> dict:
        out = CliRunner().invoke(cli, ["replay", str(log_file), "--json", *flags])
        assert out.exit_code == 0, out.output
        return orjson.loads(out.stdout)

    base, capped = run(), run("--max-turn", "2")
    assert max(s["turn"] for s in capped["table"]["states"]) == 2
    assert max(s["turn"] for s in base["table"]["states"]) > 2
    bigger = run("--capacity-blocks", "20000")
    assert bigger["forecast"]["hit_ratio"] > base["forecast"]["hit_ratio"]
    assert run("--instances", "2")["forecast"]["lambda_per_s"] == pytest.approx(
        base["forecast"]["lambda_per_s"] / 2
    )


def test_environment_variables_feed_the_flags(log_file: Path) -> None:
    out = CliRunner().invoke(cli, ["replay", str(log_file), "--json"], env={"KVCAST_MAX_TURN": "3"})
    assert max(s["turn"] for s in orjson.loads(out.stdout)["table"]["states"]) == 3


def test_human_output_shows_forecast_table_and_counters(log_file: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", str(log_file)])
    assert result.exit_code == 0
    for needle in ("hit ratio (intent-aware)", "priority table v1", "rejected 2", "duplicates 1"):
        assert needle in result.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--block-size", "0"], "--block-size"),
        (["--capacity-blocks", "-5"], "--capacity-blocks"),
        (["--completion-timeout", "0"], "--completion-timeout"),
        (["--max-turn", "x"], "--max-turn"),
    ],
)
def test_bad_flags_name_the_flag(log_file: Path, flags: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["replay", str(log_file), *flags])
    assert result.exit_code == 2
    assert message in result.output


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_empty_file_reports_no_data(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = CliRunner().invoke(cli, ["replay", str(empty), "--json"])
    assert result.exit_code == 0
    body = orjson.loads(result.stdout)
    assert body["forecast"]["status"] == "no_data" and body["forecast"]["hit_ratio"] is None
    assert body["table"]["states"] == [] and body["events"]["processed"] == 0


def test_progress_goes_to_the_given_stream_only(log_file: Path) -> None:
    import io

    from kvcast.cli.replaying import replay_file
    from kvcast.stats.config import StatsConfig

    progress = io.StringIO()
    result = replay_file(log_file, StatsConfig(), capacity_blocks=2275, progress=progress)
    lines = progress.getvalue()
    assert "events/s" in lines and "rejected 2" in lines and "duplicates 1" in lines
    assert result["events"]["rejected"] == 2


def test_the_native_and_python_engines_print_the_same_result(log_file: Path) -> None:
    require_native()
    outputs = {}
    for engine in ("native", "python"):
        result = CliRunner().invoke(cli, ["replay", str(log_file), "--json", "--engine", engine])
        assert result.exit_code == 0, result.output
        outputs[engine] = orjson.loads(result.stdout)
    assert outputs["native"] == outputs["python"]
    assert outputs["native"]["events"]["rejected"] == 2


def test_asking_for_the_native_engine_where_it_is_not_built_is_a_usage_error(
    log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = importlib.import_module("kvcast.cli.commands.replay")
    monkeypatch.setattr(command, "native_available", lambda: False)
    result = CliRunner().invoke(cli, ["replay", str(log_file), "--engine", "native"])
    assert result.exit_code == 2
    assert "not built" in result.output and "--engine python" in result.output


@pytest.mark.parametrize("engine", ["native", "python"])
def test_one_line_from_the_far_future_is_future_and_pushes_nothing_out(
    tmp_path: Path, engine: str
) -> None:
    """A line with ``timestamp: 1e300`` used to make every later event ``too_late``."""
    if engine == "native":
        require_native()
    trace = generate(preset("mixed"), lambda0=1.0, conversations=100, seed=8)
    lines = [line.strip() for line in trace.jsonl_lines()][:400]
    outlier = orjson.loads(lines[100])
    outlier.update(session_id="outlier", request_id="outlier", timestamp=1e300)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join([*lines[:100], orjson.dumps(outlier), *lines[100:]]) + b"\n")
    result = CliRunner().invoke(cli, ["replay", str(path), "--json", "--engine", engine])
    assert result.exit_code == 0, result.output
    events = orjson.loads(result.stdout)["events"]
    assert events["rejected_by_reason"] == {"future": 1}
    assert events["processed"] == 400
    small = CliRunner().invoke(
        cli, ["replay", str(path), "--json", "--engine", engine, "--max-future-skew", "0"]
    )
    assert small.exit_code == 2 and "--max-future-skew" in small.output


@pytest.mark.parametrize("engine", ["native", "python"])
def test_each_rejection_is_shown_with_its_file_line_reason_and_field(
    tmp_path: Path, engine: str
) -> None:
    if engine == "native":
        require_native()
    good = b'{"session_id":"a","turn":1,"timestamp":1,"input_tokens":5,"output_tokens":1}'
    lines = [good, b"", b"{broken", b"   ", b"",
             b'{"session_id":"a","turn":0,"timestamp":2,"input_tokens":5,"output_tokens":1}',
             b'{"session_id":"b","turn":1,"timestamp":1e300,"input_tokens":5,"output_tokens":1}',
             b'{"session_id":"secret user text","turn":"1"}']  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = CliRunner().invoke(cli, ["replay", str(path), "--json", "--engine", engine])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["events"]["rejections"] == [
        {"position": 3, "reason": "invalid_json", "field": None},
        {"position": 6, "reason": "out_of_range", "field": "turn"},
        {"position": 7, "reason": "future", "field": "timestamp"},
        {"position": 8, "reason": "wrong_type", "field": "turn"},
    ]
    human = CliRunner().invoke(cli, ["replay", str(path), "--engine", engine])
    assert "  line 6: out_of_range (field turn)" in human.stdout
    assert "secret" not in human.stdout and "secret" not in result.stdout


MOONCAKE = (
    Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_synthetic_trace.jsonl"
)


def kvcast(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed ``kvcast`` command, as a user runs it."""
    command = Path(sys.executable).with_name("kvcast")
    return subprocess.run([str(command), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_a_mooncake_trace_is_refused_with_the_convert_line_that_works(tmp_path: Path) -> None:
    """The first hour: a file in Mooncake's format given to replay says to convert it, and the
    two lines it prints, run as printed, replay it (block size 512, the trace's hash blocks)."""
    trace = tmp_path / "mooncake_synthetic_trace.jsonl"
    trace.write_bytes(MOONCAKE.read_bytes())
    refused = kvcast("replay", trace.name, cwd=tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "a trace in Mooncake's format, not kvcast events" in refused.stderr
    lines = [line.strip() for line in refused.stderr.splitlines()[1:]]
    assert (
        lines[0]
        == f"kvcast convert --format mooncake {trace.name} mooncake_synthetic_trace.events.jsonl"
    )
    assert lines[1].startswith(
        "kvcast replay mooncake_synthetic_trace.events.jsonl --block-size 512 "
    )
    for line in lines:
        done = kvcast(*line.partition("  (")[0].split()[1:], cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert "events: processed 3993, rejected 0" in done.stdout


def test_a_bailian_trace_names_its_convert_line(tmp_path: Path) -> None:
    trace = tmp_path / "bailian.jsonl"
    record = {"chat_id": 7, "parent_chat_id": -1, "timestamp": 1.5, "input_length": 40,
              "output_length": 3, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}  # fmt: skip
    trace.write_bytes(orjson.dumps(record) + b"\n")
    refused = kvcast("replay", str(trace), "--json", cwd=tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"kvcast convert --format bailian {trace} " in refused.stderr
    assert "--block-size" not in refused.stderr  # its 16-token blocks are the default


def test_a_file_whose_every_line_is_rejected_exits_1_with_a_summary(tmp_path: Path) -> None:
    log = tmp_path / "wrong.jsonl"
    log.write_text('{"user": "a", "turn": 1}\n{"user": "b", "turn": 2}\nnot json\n')
    done = kvcast("replay", str(log), "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert orjson.loads(done.stdout)["events"]["rejected"] == 3  # the result is still printed
    (line,) = done.stderr.splitlines()
    assert line == (
        f"Error: every one of the 3 lines of {log} was rejected (invalid_json 1, missing_field 2;"
        " the most common: missing_field session_id), so nothing was counted: the event contract"
        " is in docs/events.md"
    )
    log.write_text('{"user": "a"}\n' + orjson.dumps(
        {"session_id": "s", "turn": 1, "timestamp": 0.0, "input_tokens": 5, "output_tokens": 1}
    ).decode() + "\n")  # fmt: skip
    assert kvcast("replay", str(log), cwd=tmp_path).returncode == 0  # one good line is a result
