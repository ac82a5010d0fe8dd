"""``kvcast convert`` end to end, then ``kvcast simulate --granularity block`` on its output."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from kvcast.cli.main import cli


def _write(path: Path, rows: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def test_convert_mooncake_then_simulate_block(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 2000, "input_length": 1024, "output_length": 1, "hash_ids": [1, 4]},
    ]
    src, dst = tmp_path / "mc.jsonl", tmp_path / "ev.jsonl"
    _write(src, rows)
    runner = CliRunner()
    res = runner.invoke(cli, ["convert", "--format", "mooncake", str(src), str(dst), "--json"])
    assert res.exit_code == 0, res.output
    summary = orjson.loads(res.stdout)
    assert (summary["conversations"], summary["continuations"]) == (2, 1)
    res = runner.invoke(
        cli,
        [
            "simulate",
            str(dst),
            "--granularity",
            "block",
            "--policy",
            "lru",
            "--capacity-blocks",
            "10",
            "--warmup-fraction",
            "0",
            "--cooldown-fraction",
            "0",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = orjson.loads(res.stdout)
    # Blocks come from the hashes (512-token blocks): 2 + 3 + 2 input, 2 + 1 reused.
    assert (out["hit_blocks"], out["input_blocks"], out["block_hashes"]) == (3, 7, True)
    for policy in ("iac", "iac-rolling", "tbs", "lfu", "gdsf"):
        res = runner.invoke(
            cli,
            [
                "simulate",
                str(dst),
                "--granularity",
                "block",
                "--policy",
                policy,
                "--capacity-blocks",
                "10",
                "--json",
            ],
        )
        assert res.exit_code == 0, (policy, res.output)


def test_convert_reports_file_and_line(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_bytes(
        b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n{not json\n'
    )
    res = CliRunner().invoke(
        cli, ["convert", "--format", "mooncake", str(src), str(tmp_path / "o.jsonl")]
    )
    assert res.exit_code != 0
    assert f"{src}:2: not valid JSON" in res.output


def test_convert_sharegpt_array(tmp_path: Path) -> None:
    src, dst = tmp_path / "sg.json", tmp_path / "ev.jsonl"
    src.write_bytes(
        orjson.dumps(
            [
                {
                    "id": "a",
                    "conversations": [
                        {"from": "human", "value": "hello there"},
                        {"from": "gpt", "value": "hi"},
                    ],
                }
            ]
        )
    )
    res = CliRunner().invoke(
        cli, ["convert", "--format", "sharegpt", str(src), str(dst), "--rate", "0.5"]
    )
    assert res.exit_code == 0, res.output
    ev = orjson.loads(dst.read_bytes().splitlines()[0])
    assert ev["prompt"] == "hello there" and ev["input_tokens"] == 3


def test_simulate_unknown_policy_is_a_usage_error(tmp_path: Path) -> None:
    src = tmp_path / "ev.jsonl"
    _write(
        src, [{"session_id": "a", "turn": 1, "timestamp": 0, "input_tokens": 5, "output_tokens": 1}]
    )
    res = CliRunner().invoke(
        cli,
        [
            "simulate",
            str(src),
            "--policy",
            "nope",
            "--granularity",
            "block",
            "--capacity-blocks",
            "4",
        ],
    )
    assert res.exit_code == 2 and "unknown policy" in res.output
