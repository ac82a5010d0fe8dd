"""``kvcast forecast`` from moments: reference points, output forms and flag errors."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli

SHAREGPT = [
    "--A-R",
    "38.9092",
    "--A-H-hash",
    "22.5178",
    "--E-B",
    "12.9220",
    "--delay",
    "exp:135",
    "--capacity-blocks",
    "2275",
]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["forecast", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("lam", "expected"), [("0.5", 0.4253), ("1.0", 0.2476), ("1.5", 0.1718), ("2.0", 0.1312)]
)
def test_reference_points_json(lam: str, expected: float) -> None:
    code, out = run("--lambda", lam, *SHAREGPT, "--json")
    assert code == 0, out
    d = orjson.loads(out)
    assert round(d["hit_ratio"], 4) == expected
    assert round(d["hit_ratio_single_class"], 4) == expected
    for key in (
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
        "status",
    ):
        assert key in d
    assert d["status"] == "ok" and d["block_size"] == 16 and d["instances"] == 1


def test_instances_curve_target_bytes() -> None:
    code, out = run(
        "--lambda",
        "4",
        *SHAREGPT,
        "--instances",
        "4",
        "--block-size",
        "128",
        "--capacities",
        "1000,2275,5000",
        "--target-hit-ratio",
        "0.3",
        "--kv-bytes-per-token",
        "147456",
        "--json",
    )
    assert code == 0, out
    d = orjson.loads(out)
    assert d["lambda_per_s"] == 1.0 and round(d["hit_ratio"], 4) == 0.2476
    assert [p["capacity_blocks"] for p in d["curve"]] == [1000, 2275, 5000]
    assert round(d["curve"][1]["hit_ratio"], 4) == 0.2476
    req = d["required_capacity"]
    assert req["status"] == "ok" and req["bytes"] == req["blocks"] * 128 * 147456
    assert 2275 < req["blocks"] < 5000


def test_human_output() -> None:
    code, out = run(
        "--lambda", "1", *SHAREGPT, "--capacities", "1000,5000", "--target-hit-ratio", "0.3"
    )
    assert code == 0, out
    assert "0.2476" in out and "upper bound" in out and "capacity_blocks" in out
    assert "capacity for hit ratio 0.3:" in out


def test_lognormal_and_file_delay(tmp_path) -> None:
    code, out = run(
        "--lambda",
        "1",
        *SHAREGPT[:-4],
        "--delay",
        "lognormal:4.6,1.0",
        "--capacity-blocks",
        "2275",
        "--json",
    )
    assert code == 0, out
    assert 0 < orjson.loads(out)["hit_ratio"] < 0.5787
    f = tmp_path / "w.txt"
    f.write_text("\n".join(str(x) for x in (10, 50, 100, 200, 400)))
    code, out = run(
        "--lambda", "1", *SHAREGPT[:-4], "--delay", str(f), "--capacity-blocks", "2275", "--json"
    )
    assert code == 0, out
    d = orjson.loads(out)
    assert d["delay_samples"] == 5 and d["status"] == "ok"


def test_whole_displacement_and_degenerate() -> None:
    code, out = run("--lambda", "1", *SHAREGPT, "--A-H", "27", "--displacement", "whole", "--json")
    assert code == 0, out
    d = orjson.loads(out)
    assert d["variant"] == "paper_whole" and d["hit_ratio"] < d["hit_ratio_single_class"]
    code, out = run("--lambda", "0", *SHAREGPT, "--target-hit-ratio", "0.3", "--json")
    d = orjson.loads(out)
    assert d["status"] == "zero_rate" and d["hit_ratio"] == d["upper_bound"]
    assert d["characteristic_time_s"] is None
    code, out = run("--lambda", "1", *SHAREGPT, "--target-hit-ratio", "0.9", "--json")
    assert orjson.loads(out)["required_capacity"]["status"] == "unreachable"
    code, out = run("--lambda", "1", *SHAREGPT, "--target-hit-ratio", "0.9")
    assert "unreachable" in out


@pytest.mark.parametrize(
    ("args", "flag", "msg"),
    [
        (["--lambda", "-1"], "--lambda", ">= 0"),
        (["--lambda", "1", "--capacity-blocks", "0"], "--capacity-blocks", "> 0"),
        (["--lambda", "1", "--capacity-blocks", "-5"], "--capacity-blocks", "> 0"),
        (["--lambda", "1", "--delay", "exp:-3"], "--delay", "mean must be > 0"),
        (["--lambda", "1", "--delay", "weibull:2"], "--delay", "expected exp:MEAN_S"),
        (["--lambda", "1", "--target-hit-ratio", "1.5"], "--target-hit-ratio", "between 0 and 1"),
        (["--lambda", "1", "--target-hit-ratio", "0"], "--target-hit-ratio", "between 0 and 1"),
        (["--lambda", "1", "--capacities", "10,x"], "--capacities", "'x'"),
        (["--lambda", "1", "--A-H-hash", "50"], "--A-H-hash", "cannot exceed"),
        (["--lambda", "1", "--displacement", "whole"], "--A-H", "needs --A-H"),
    ],
)
def test_bad_flags(args: list[str], flag: str, msg: str) -> None:
    # later occurrences of a flag override SHAREGPT's
    code, out = run(*SHAREGPT, *args)
    assert code == 2
    assert flag in out and msg in out


def test_missing_flags() -> None:
    code, out = run("--lambda", "1")
    assert code == 2 and "--A-R" in out and "--delay" in out
