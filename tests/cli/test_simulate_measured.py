"""``kvcast simulate`` says when it measures little (fewer than half of the conversations),
on stderr and in ``--json``'s ``warnings``; and ``--policy density`` finishes on a trace with
epoch timestamps, with the hits of the same trace shifted to start at 0 (issue 33)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from tests.deadline import deadline


def events(conversations: int = 40, seed: int = 2) -> list[dict[str, object]]:
    """A mixed-preset trace as contract events, times on a 1/1024 s grid (exact when
    shifted by 1.7e9 s, so both copies hold the same ages)."""
    found = generate(preset("mixed"), lambda0=1.0, conversations=conversations, seed=seed)
    out = []
    for e in found.events():
        e = dict(e)
        e["timestamp"] = round(float(e["timestamp"]) * 1024) / 1024
        out.append(e)
    return out


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def late(rows: list[dict[str, object]], after_s: float) -> list[dict[str, object]]:
    """The trace plus one two-turn conversation opening ``after_s`` after its last event."""
    last = max(float(r["timestamp"]) for r in rows)  # type: ignore[arg-type]
    extra = []
    for turn in (1, 2):
        extra.append(
            {"session_id": "straggler", "turn": turn, "timestamp": last + after_s + 30.0 * turn,
             "input_tokens": 512 * turn, "output_tokens": 64, "request_id": f"straggler-{turn}",
             "intent": "chat"}
        )  # fmt: skip
    return rows + extra


def simulate(runner: CliRunner, path: Path, *flags: str) -> tuple[dict[str, object], str]:
    res = runner.invoke(cli, ["simulate", str(path), "--capacity-blocks", "300", *flags, "--json"])
    assert res.exit_code == 0, res.output
    return orjson.loads(res.stdout), res.stderr


def test_a_straggler_that_leaves_nothing_measured_is_warned_about(tmp_path: Path) -> None:
    runner = CliRunner()
    rows = events()
    got, err = simulate(runner, write(tmp_path / "ok.jsonl", rows))
    assert got["warnings"] == [] and "warning" not in err
    assert 2 * got["measured_conversations"] >= got["conversations"]  # type: ignore[operator]

    path = write(tmp_path / "late.jsonl", late(rows, 1e6))
    got, err = simulate(runner, path)
    # The span of first-turn times is the straggler's million seconds: the window between
    # 20 % and 80 % of it holds no conversation, and the hit ratio is of nothing.
    assert got["measured_conversations"] == 0 and got["hit_ratio"] == 0.0
    assert got["conversations"] == len({r["session_id"] for r in rows}) + 1
    (warning,) = got["warnings"]  # type: ignore[misc]
    assert warning.startswith(f"measured 0 of {got['conversations']} conversations")
    assert f"warning: {path}: {warning}" in err.splitlines()
    assert "--warmup-fraction 0 --cooldown-fraction 0" in warning
    # Both fractions 0 measure every conversation, and no warning is left.
    got, err = simulate(runner, path, "--warmup-fraction", "0", "--cooldown-fraction", "0")
    assert got["measured_conversations"] == got["conversations"] and got["warnings"] == []


def test_the_text_output_warns_on_stderr_too(tmp_path: Path) -> None:
    path = write(tmp_path / "late.jsonl", late(events(), 1e6))
    res = CliRunner().invoke(cli, ["simulate", str(path), "--capacity-blocks", "300"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("hit_ratio 0.0000") and "warning" not in res.stdout
    assert res.stderr.startswith(f"warning: {path}: measured 0 of ")


@pytest.mark.parametrize("granularity", ["block", "conversation"])
def test_density_on_epoch_timestamps_gives_the_hits_of_the_trace_at_zero(
    tmp_path: Path, granularity: str
) -> None:
    """The issue's report: the same file with epoch timestamps (1.7e9 s) never finished."""
    runner = CliRunner()
    rows = events(conversations=120, seed=5)
    epoch = [{**r, "timestamp": float(r["timestamp"]) + 1.7e9} for r in rows]  # type: ignore[arg-type]
    flags = ("--policy", "density", "--granularity", granularity, "--horizon-s", "120")
    with deadline(20.0, "a flip loops: simulate is still running"):
        at_zero, _ = simulate(runner, write(tmp_path / "zero.jsonl", rows), *flags)
        at_epoch, _ = simulate(runner, write(tmp_path / "epoch.jsonl", epoch), *flags)
    assert 0 < at_zero["hit_blocks"] < at_zero["input_blocks"]  # type: ignore[operator]
    for key in ("hit_blocks", "input_blocks", "measured_conversations", "warnings"):
        assert at_epoch[key] == at_zero[key]
