"""``kvcast generate`` and ``kvcast simulate`` end to end through the click group."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.lab.sim.registry import simulate
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner()


def test_generate_then_simulate_json(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    res = runner.invoke(
        cli,
        [
            "generate",
            str(out),
            "--preset",
            "mixed",
            "--lambda",
            "2",
            "--duration",
            "600",
            "--seed",
            "4",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = orjson.loads(res.stdout)
    lines = out.read_bytes().splitlines()
    assert summary["events"] == len(lines) > 0
    assert summary["conversations"] == len({orjson.loads(x)["session_id"] for x in lines})

    res = runner.invoke(
        cli, ["simulate", str(out), "--policy", "lru", "--capacity-blocks", "800", "--json"]
    )
    assert res.exit_code == 0, res.output
    got = orjson.loads(res.stdout)
    for key in (
        "hit_ratio",
        "policy",
        "capacity_blocks",
        "hit_blocks",
        "input_blocks",
        "measured_conversations",
        "measured_requests",
    ):
        assert key in got
    assert got["policy"] == "lru" and got["capacity_blocks"] == 800
    assert got["events"] == {"processed": len(lines), "rejected": 0, "duplicates": 0}
    # Same numbers as the library on the same trace (timestamps survive the JSON round trip).
    lib = simulate(generate(preset("mixed"), lambda0=2, duration_s=600, seed=4).sim_trace(), 800)
    assert (got["hit_blocks"], got["input_blocks"]) == (lib.hit_blocks, lib.input_blocks)
    assert got["hit_ratio"] == pytest.approx(lib.hit_ratio)


def test_simulate_reports_bad_lines_and_skips_duplicates(runner: CliRunner, tmp_path: Path) -> None:
    good = [
        {"session_id": "a", "turn": 1, "timestamp": 0.0, "input_tokens": 40, "output_tokens": 5},
        {"session_id": "a", "turn": 2, "timestamp": 5.0, "input_tokens": 90, "output_tokens": 5},
    ]
    body = [
        orjson.dumps(good[0]),
        b"{not json",
        orjson.dumps(good[0]),
        orjson.dumps(
            {"session_id": "b", "turn": 0, "timestamp": 1.0, "input_tokens": 1, "output_tokens": 1}
        ),
        b"",
        orjson.dumps(good[1]),
    ]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(body) + b"\n")
    res = runner.invoke(
        cli,
        [
            "simulate",
            str(path),
            "--capacity-blocks",
            "100",
            "--warmup-fraction",
            "0",
            "--cooldown-fraction",
            "0",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert f"{path}:2: rejected (invalid_json)" in res.stderr
    assert f"{path}:4: rejected (out_of_range)" in res.stderr
    got = orjson.loads(res.stdout)
    assert got["events"] == {"processed": 2, "rejected": 2, "duplicates": 1}
    # R = 3 then 6 blocks; turn 2 reuses 3 - 1.
    assert (got["hit_blocks"], got["input_blocks"]) == (2, 9)


def test_simulate_text_output_and_errors(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        orjson.dumps(
            {"session_id": "a", "turn": 1, "timestamp": 0.0, "input_tokens": 4, "output_tokens": 1}
        )
        + b"\n"
    )
    res = runner.invoke(cli, ["simulate", str(path), "--capacity-blocks", "10"])
    assert res.exit_code == 0 and res.stdout.startswith("hit_ratio 0.0000")
    res = runner.invoke(cli, ["simulate", str(path), "--capacity-blocks", "0"])
    assert res.exit_code == 2 and "--capacity-blocks" in res.stderr  # no cache: no simulation
    res = runner.invoke(
        cli, ["simulate", str(path), "--capacity-blocks", "10", "--granularity", "block"]
    )
    assert res.exit_code == 0 and "policy lru/block" in res.stdout
    res = runner.invoke(cli, ["simulate", str(path), "--capacity-blocks", "10", "--policy", "tbs"])
    assert res.exit_code == 2 and "unknown policy 'tbs' with granularity" in res.stderr
    res = runner.invoke(
        cli, ["simulate", str(path), "--capacity-blocks", "10", "--warmup-fraction", "0.9"]
    )
    assert res.exit_code == 2 and "fractions" in res.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"garbage\n")
    res = runner.invoke(cli, ["simulate", str(empty), "--capacity-blocks", "10"])
    assert res.exit_code == 1 and "no valid events" in res.stderr


def test_generate_text_summary_and_determinism(runner: CliRunner, tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p in (a, b):
        res = runner.invoke(
            cli,
            [
                "generate",
                str(p),
                "--conversations",
                "50",
                "--seed",
                "9",
                "--no-prompts",
                "--cached-capacity-blocks",
                "100",
            ],
        )
        assert res.exit_code == 0, res.output
        assert res.stdout.startswith("wrote ") and "50 conversations" in res.stdout
    assert a.read_bytes() == b.read_bytes()
    first = orjson.loads(a.read_bytes().splitlines()[0])
    assert "prompt" not in first and first["cached_tokens"] == 0


@pytest.mark.parametrize("granularity", ["block", "conversation"])
def test_simulate_density_is_the_librarys(
    runner: CliRunner, tmp_path: Path, granularity: str
) -> None:
    gen = generate(preset("mixed"), lambda0=2, duration_s=600, seed=5)
    out = tmp_path / "w.jsonl"
    out.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in gen.events()))
    args = ["simulate", str(out), "--policy", "density", "--capacity-blocks", "600",
            "--granularity", granularity, "--json"]  # fmt: skip
    for extra, options in (([], {}), (["--horizon-s", "900"], {"horizon_s": 900.0})):
        res = runner.invoke(cli, args + extra)
        assert res.exit_code == 0, res.output
        got = orjson.loads(res.stdout)
        lib = simulate(gen.sim_trace(), 600, "density", granularity, **options)
        assert got["policy"] == "density" and got["hit_blocks"] == lib.hit_blocks
        assert got["options"].get("horizon_s") == options.get("horizon_s")
