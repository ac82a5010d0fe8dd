"""``kvcast bench``: each figure comes with the baseline timed in the same run; bad input."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.commands.bench import DEFAULT_SUITES
from kvcast.cli.main import cli
from kvcast.lab.bench.machine import cpu_model
from kvcast.stats.native.replay import native_available


def _bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["bench", *args])
    return result.exit_code, result.output


def test_json_gives_every_throughput_figure_with_its_decode_baseline() -> None:
    code, output = _bench("--suite", "throughput", "--conversations", "200", "--json")
    assert code == 0, output
    figures = orjson.loads(output)
    assert set(figures) == {"machine", "throughput"}
    throughput = figures["throughput"]
    assert throughput["events"] > 200  # several turns per conversation
    rates = ("decode_per_s", "parse_per_s", "pipeline_per_s", "python_pipeline_per_s")
    for rate in (*rates, "simulate_per_s", "shared_index_per_s", "shared_index_off_per_s"):
        assert throughput[rate] > 0, rate
    assert throughput["shared_events"] > 50  # the shared_system preset, a quarter of them
    for name in ("pipeline", "python_pipeline"):
        assert throughput[f"{name}_vs_decode"] == pytest.approx(
            throughput[f"{name}_per_s"] / throughput["decode_per_s"]
        )
    expected_engine = "native" if native_available() else "python"
    assert throughput["replay_engine"] == expected_engine


def test_the_shadow_suite_gives_its_error_cpu_and_memory_against_the_exact_simulation() -> None:
    code, output = _bench("--suite", "shadow", "--shadow-requests", "3000", "--json")
    assert code == 0, output
    shadow = orjson.loads(output)["shadow"]
    assert shadow["requests"] == shadow["exact_requests"] == 3000
    assert len(shadow["exact_curve"]) == len(shadow["capacities"]) == 17
    assert shadow["max_abs_error"] == max(shadow["max_abs_errors"]) >= 0
    assert shadow["shadow_ns_per_event"] > 0 and shadow["exact_ns_per_event"] > 0
    assert shadow["memory_bytes"] > 0


def test_json_gives_the_solver_against_brentq_and_their_agreement() -> None:
    code, output = _bench("--suite", "solver", "--json")
    assert code == 0, output
    solver = orjson.loads(output)["solver"]
    assert solver["points"] == 100 and solver["delays"] == 100_000
    assert solver["ratio"] == pytest.approx(solver["naive_s"] / solver["exact_s"])
    # The fast curve must be the same curve, not merely a faster one.
    assert solver["max_abs_diff"] < 1e-6


def test_markdown_table_has_a_baseline_and_a_ratio_in_every_row() -> None:
    code, output = _bench("--suite", "throughput", "--conversations", "100")
    assert code == 0, output
    table = [line for line in output.splitlines() if line.startswith("|")]
    assert table[0] == "| benchmark | figure | baseline (same run) | ratio |"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]
    engine = "native" if native_available() else "python"
    assert [row[0] for row in rows] == [
        "parse_event (contract)",
        f"replay pipeline (parse + track + window, {engine} engine)",
        "daemon pipeline (the same, Python engine, per event)",
        "daemon pipeline, events with block_hashes (shared_system, 16-token blocks), "
        "shared-prefix index on",
        "Algorithm 1 simulator (from arrays)",
    ]
    for row in rows:
        # Each against decoding the same lines, or (the index) against the index off.
        assert "orjson.loads" in row[2] or "--shared-index-blocks 0" in row[2]
        float(row[3])  # a number, measured in this run


def test_figures_name_the_machine_they_were_measured_on() -> None:
    code, output = _bench("--suite", "throughput", "--conversations", "100", "--json")
    assert code == 0, output
    machine = orjson.loads(output)["machine"]
    assert machine["cores"] == len(os.sched_getaffinity(0))
    assert machine["arch"] == platform.machine()
    assert machine["python"].endswith(platform.python_version())
    assert machine["cpu"] and machine["memory_gib"] > 0
    code, output = _bench("--suite", "throughput", "--conversations", "100")
    assert f"Measured on: {machine['cpu']}, {machine['cores']} cores" in output


def test_cpu_model_reads_the_first_model_name(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU @ 3.0GHz\nmodel name\t: Other\n")
    assert cpu_model(cpuinfo) == "Example CPU @ 3.0GHz"
    assert cpu_model(tmp_path / "missing") == (platform.processor() or "unknown")


def test_help_names_the_suites_run_by_default() -> None:
    code, output = _bench("--help")
    assert code == 0
    assert f"default: {', '.join(DEFAULT_SUITES)}" in " ".join(output.split())


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--suite", "everything"], "'--suite'"),
        (["--conversations", "5"], "'--conversations'"),
        (["--conversations", "many"], "'--conversations'"),
    ],
)
def test_bad_options_are_refused_by_name(args: list[str], named: str) -> None:
    code, output = _bench(*args)
    assert code == 2
    assert named in output


def test_the_engines_suite_names_the_missing_venv_and_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVCAST_BENCH_VLLM_PYTHON", str(tmp_path / "no-venv" / "python"))
    code, output = _bench("--suite", "engines")
    assert code != 0
    assert "vllm: no interpreter at" in output
    assert "scripts/engine_venv.sh vllm" in output


def test_the_sim_scale_suite_times_kvcast_simulate_per_policy_within_its_budget() -> None:
    result = CliRunner().invoke(cli, ["bench", "--suite", "sim-scale", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    assert "sim-scale density at 1,000 blocks" in result.stderr  # progress, one line a run
    scale = orjson.loads(result.stdout)["sim-scale"]
    assert [r["policy"] for r in scale["runs"]] == ["lru", "iac", "density"]
    assert scale["references"] > scale["requests"] > 30  # ~130 blocks of 1,024 tokens a request
    for run in scale["runs"]:
        assert run["capacity_blocks"] == 1000 and 0.0 < run["hit_ratio"] < 1.0
        assert run["references_per_s"] == pytest.approx(scale["references"] / run["wall_s"])
        assert 0 < run["simulate_s"] < run["wall_s"] and run["peak_rss_bytes"] > 10**7
    assert scale["within_budget"] is True
