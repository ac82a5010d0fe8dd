"""``--tier`` / ``--tier-mode`` / ``--tier-for`` on ``kvcast forecast`` and ``kvcast simulate``:
the document's tiers, the per-tier simulation, and clear errors naming the flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset

MOMENTS = ["--lambda", "2", "--A-R", "40", "--A-H-hash", "30", "--E-B", "12", "--delay", "exp:100"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_forecast_json_has_one_entry_per_tier() -> None:
    code, out = run("forecast", *MOMENTS, "--capacity-blocks", "2000", "--json")
    assert code == 0, out
    doc = orjson.loads(out)
    assert doc["tier_mode"] == "exclusive"
    assert doc["tiers"] == [
        {"name": "gpu", "capacity_blocks": 2000.0, "hit_ratio": doc["hit_ratio"]}
    ]
    code, out = run(
        "forecast", *MOMENTS, "--capacity-blocks", "2000", "--tier", "host=4000",
        "--tier", "disk=8000", "--json",
    )  # fmt: skip
    doc = orjson.loads(out)
    assert [t["name"] for t in doc["tiers"]] == ["gpu", "host", "disk"]
    _, whole = run("forecast", *MOMENTS, "--capacity-blocks", "14000", "--json")
    total = sum(t["hit_ratio"] for t in doc["tiers"])
    assert total == pytest.approx(orjson.loads(whole)["hit_ratio"])


def test_forecast_plans_a_tier() -> None:
    base = ["forecast", *MOMENTS, "--capacity-blocks", "2000", "--tier", "host=1"]
    code, out = run(*base, "--target", "0.6", "--tier-for", "host", "--json")
    assert code == 0, out
    plan = orjson.loads(out)["required_capacity"]
    _, single = run("forecast", *MOMENTS, "--capacity-blocks", "2000", "--target", "0.6", "--json")
    whole = orjson.loads(single)["required_capacity"]["blocks"]
    assert plan == {"target": 0.6, "blocks": whole - 2000, "bytes": None, "status": "ok",
                    "tier": "host"}  # fmt: skip
    code, out = run(*base, "--target", "0.1", "--tier-for", "host")
    assert code == 0 and "tier host for total hit ratio 0.1: 0 blocks (the tiers above" in out
    code, out = run(*base, "--target", "0.8", "--tier-for", "host")
    assert code == 0 and "unreachable (above the hit ratio of an unlimited cache)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tier", "gpu=5"], "'--tier'"),
        (["--tier", "host"], "NAME=BLOCKS"),
        (["--tier", "host=-3"], ">= 1"),
        (["--tier", "host=5", "--tier", "host=6"], "given twice"),
        (["--tier", "host=5", "--tier-mode", "inclusive"], "at least as large"),
        (["--tier-mode", "both"], "'--tier-mode'"),
        (["--tier-for", "disk", "--target", "0.5"], "'--tier-for'"),
        (["--tier", "host=5", "--tier-for", "host"], "needs --target"),
    ],
)
def test_forecast_bad_tier_flags(args: list[str], message: str) -> None:
    code, out = run("forecast", *MOMENTS, "--capacity-blocks", "2000", *args)
    assert code == 2 and message in out and "Traceback" not in out, out


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiers") / "agentic.jsonl"
    trace = generate(preset("agentic"), lambda0=0.5, duration_s=1200.0, seed=5)
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in trace.events()))
    return path


@pytest.mark.parametrize("mode", ["exclusive", "inclusive"])
def test_simulate_reports_hits_per_tier(replay: Path, mode: str) -> None:
    code, out = run(
        "simulate", str(replay), "--granularity", "block", "--capacity-blocks", "300",
        "--tier", "host=900", "--tier-mode", mode, "--json",
    )  # fmt: skip
    assert code == 0, out
    doc = orjson.loads(out.splitlines()[-1])
    trace = SimTrace.from_event_dicts([orjson.loads(x) for x in replay.read_bytes().splitlines()])
    gpu = simulate(trace, 300, "lru", "block").hit_ratio
    total = simulate(trace, 1200 if mode == "exclusive" else 900, "lru", "block").hit_ratio
    assert doc["tier_mode"] == mode
    assert [(t["name"], t["capacity_blocks"]) for t in doc["tiers"]] == [
        ("gpu", 300),
        ("host", 900),
    ]
    assert doc["tiers"][0]["hit_ratio"] == pytest.approx(gpu, abs=1e-12)
    assert doc["hit_ratio"] == pytest.approx(total, abs=1e-12)
    assert np.isclose(sum(t["hit_ratio"] for t in doc["tiers"]), doc["hit_ratio"])
    code, out = run(
        "simulate", str(replay), "--granularity", "block", "--capacity-blocks", "300",
        "--tier", "host=900", "--tier-mode", mode,
    )  # fmt: skip
    assert code == 0 and "tier host: 900 blocks, hit_ratio" in out, out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tier", "host=900"], "--granularity block"),
        (["--granularity", "block", "--policy", "lfu", "--tier", "host=900"], "--policy lru"),
        (["--granularity", "block", "--tier", "Host=9"], "lowercase"),
        (["--granularity", "block", "--tier", "host=100", "--tier-mode", "inclusive"],
         "at least as large"),
    ],
)  # fmt: skip
def test_simulate_bad_tier_flags(replay: Path, args: list[str], message: str) -> None:
    code, out = run("simulate", str(replay), "--capacity-blocks", "300", *args)
    assert code == 2 and message in out and "Traceback" not in out, out


def test_run_takes_tiers_from_flags_environment_and_config_file(tmp_path: Path) -> None:
    config = tmp_path / "kvcast.toml"
    config.write_text('capacity-blocks = 1000\ntier = ["host=4000", "disk=9000"]\n')
    code, out = run("run", "--config", str(config), "--print-config")
    assert code == 0, out
    doc = orjson.loads(out)
    assert doc["tiers"] == [
        {"name": "host", "capacity_blocks": 4000}, {"name": "disk", "capacity_blocks": 9000},
    ]  # fmt: skip
    assert doc["tier_mode"] == "exclusive"
    result = CliRunner().invoke(
        cli, ["run", "--config", str(config), "--tier", "host=5000", "--tier-mode", "inclusive",
              "--print-config"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    assert (doc["tiers"], doc["tier_mode"]) == (
        [{"name": "host", "capacity_blocks": 5000}],
        "inclusive",
    )
    result = CliRunner().invoke(
        cli, ["run", "--print-config"], env={"KVCAST_TIER": "host=3000 disk=30000"}
    )
    assert [t["name"] for t in orjson.loads(result.output)["tiers"]] == ["host", "disk"]


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ('tier = ["host=x"]\n', [], "tier = ['host=x'] (--tier)"),
        ('tier = ["host=100"]\ntier-mode = "inclusive"\n', [], "at least as large"),
        ("", ["--tier", "gpu=3"], "GPU tier"),
        ('tier-mode = "sideways"\n', [], "--tier-mode"),
    ],
)
def test_run_bad_tiers_are_named(
    tmp_path: Path, content: str, args: list[str], message: str
) -> None:
    config = tmp_path / "kvcast.toml"
    config.write_text(content)
    code, out = run("run", "--config", str(config), *args, "--print-config")
    assert code == 2 and message in out and "Traceback" not in out, out


def test_the_worked_example_in_docs_tiers_prints_its_figures(tmp_path: Path) -> None:
    """docs/tiers.md's example: 512 GiB of host behind 8 x 80 GiB, on the Mooncake trace."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "tiers.md").read_text()
    events = tmp_path / "mooncake.jsonl"
    code, out = run(
        "convert", str(root / "data/traces/mooncake_synthetic_trace.jsonl"), str(events),
        "--format", "mooncake",
    )  # fmt: skip
    assert code == 0, out
    stack = ["--block-size", "512", "--capacity-blocks", "2851", "--tier", "host=3276"]
    figures = {}
    for mode in ("exclusive", "inclusive"):
        code, out = run(
            "forecast", "--from-replay", str(events), *stack, "--tier-mode", mode, "--json"
        )
        assert code == 0, out
        figures[("forecast", mode)] = [t["hit_ratio"] for t in orjson.loads(out)["tiers"]]
        code, out = run(
            "simulate", str(events), "--granularity", "block", *stack, "--tier-mode", mode,
            "--warmup-fraction", "0", "--cooldown-fraction", "0", "--json",
        )  # fmt: skip
        assert code == 0, out
        tiers = orjson.loads(out.splitlines()[-1])["tiers"]
        figures[("simulator", mode)] = [t["hit_ratio"] for t in tiers]
    # The README's sentence is the same example, rounded: GPU alone to GPU + host (exclusive).
    readme = (root / "README.md").read_text().replace("\n", " ")
    for what in ("forecast", "simulator"):
        gpu, host = figures[(what, "exclusive")]
        assert f"{gpu:.2f} to {gpu + host:.2f}" in readme, (what, gpu, host)
    forecast_row = next(line for line in doc.splitlines() if line.startswith("| forecast"))
    simulator_row = next(line for line in doc.splitlines() if line.startswith("| tiered simulator"))
    for (what, mode), (gpu, host) in figures.items():
        row = forecast_row if what == "forecast" else simulator_row
        assert f"{gpu:.3f}" in row, (what, mode, gpu, row)
        assert f"host {host:.3f}" in row, (what, mode, host, row)
        if mode == "exclusive":
            assert f"{gpu + host:.3f}" in row, (what, gpu + host, row)
    code, out = run(
        "forecast", "--from-replay", str(events), *stack, "--target", "0.4", "--tier-for", "host",
        "--kv-bytes-per-token", "327680", "--json",
    )  # fmt: skip
    assert f"{orjson.loads(out)['required_capacity']['blocks']:,} blocks" in doc
