"""``kvcast generate --preset agent``: 1,024-token blocks unless asked, per-request intents,
and ``kvcast simulate`` takes its file with every block policy."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.lab.workload.presets import AGENT_INTENTS


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("agent") / "agent.jsonl"
    args = ["generate", str(out), "--preset", "agent", "--conversations", "40"]
    res = CliRunner().invoke(cli, [*args, "--lambda", "0.05", "--seed", "3", "--json"])
    assert res.exit_code == 0, res.output
    return out, orjson.loads(res.stdout)


def test_generate_agent_writes_1024_token_blocks_and_ending_intents(
    agent_file: tuple[Path, dict],
) -> None:
    out, summary = agent_file
    events = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert summary["block_size"] == 1024 and summary["events"] == len(events)
    assert summary["conversations"] == len({e["session_id"] for e in events}) > 40  # sub-agents
    assert set(summary["request_intents"]) == {e["intent"] for e in events} == set(AGENT_INTENTS)
    assert sum(summary["request_intents"].values()) == len(events)
    assert "upper_bound_model" not in summary and 0.5 < summary["upper_bound_trace"] < 1.0
    for e in events:
        assert len(e["block_hashes"]) == math.ceil(e["input_tokens"] / 1024)


def test_generate_agent_takes_an_explicit_block_size(tmp_path: Path) -> None:
    out = tmp_path / "a.jsonl"
    args = ["generate", str(out), "--preset", "agent", "--conversations", "5", "--lambda", "0.05"]
    res = CliRunner().invoke(cli, [*args, "--block-size", "4096", "--json"])
    assert res.exit_code == 0, res.output
    assert orjson.loads(res.stdout)["block_size"] == 4096
    first = orjson.loads(out.read_bytes().splitlines()[0])
    assert len(first["block_hashes"]) == math.ceil(first["input_tokens"] / 4096)


@pytest.mark.parametrize("policy", ["lru", "iac", "density"])
def test_simulate_takes_the_agent_file(agent_file: tuple[Path, dict], policy: str) -> None:
    out, _ = agent_file
    args = ["simulate", str(out), "--policy", policy, "--granularity", "block"]
    # 40 roots arrive in ~800 s, sub-agents of late requests hours later: measure them all.
    args += ["--warmup-fraction", "0", "--cooldown-fraction", "0", "--block-size", "1024"]
    res = CliRunner().invoke(cli, [*args, "--capacity-blocks", "2000", "--json"])
    assert res.exit_code == 0, res.output
    got = orjson.loads(res.stdout)
    assert 0.5 < got["hit_ratio"] < 1.0 and got["measured_requests"] == got["requests"]
