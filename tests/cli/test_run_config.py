"""`kvcast run` configuration: flags > KVCAST_* environment > --config file > defaults."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli


def resolved(*args: str, env: dict[str, str] | None = None) -> dict:
    result = CliRunner().invoke(cli, ["run", *args, "--print-config"], env=env or {})
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def test_defaults_are_the_embedded_default() -> None:
    settings = resolved()
    assert settings["source"] is None and settings["store"] == "memory://"
    assert settings["metrics_addr"] == "127.0.0.1:9400"
    assert settings["stats"]["block_size"] == 16 and settings["capacity_blocks"] == 2275


def test_the_consumer_group_defaults_to_one_per_namespace_and_topic(tmp_path: Path) -> None:
    source = ["--source", "kafka://kafka:9092/requests"]
    assert resolved(*source)["group_id"] == "kvcast.kvcast.requests"
    assert resolved(*source, "--namespace", "prod")["group_id"] == "kvcast.prod.requests"
    assert resolved(*source, "--group-id", "mine")["group_id"] == "mine"
    assert resolved(*source, env={"KVCAST_GROUP_ID": "env"})["group_id"] == "env"
    config = tmp_path / "kvcast.toml"
    config.write_text('namespace = "file"\n')
    assert resolved("--config", str(config), *source)["group_id"] == "kvcast.file.requests"


def test_layers_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "kvcast.toml"
    config.write_text(
        'capacity-blocks = 5000\nnamespace = "file"\nblock_size = 32\n'
        "commit-interval = 2.5\nrefresh_interval_s = 7\n"
    )
    settings = resolved(
        "--config", str(config), "--block-size", "64", env={"KVCAST_NAMESPACE": "env"}
    )
    assert settings["capacity_blocks"] == 5000  # file over default
    assert settings["namespace"] == "env"  # environment over file
    assert settings["stats"]["block_size"] == 64  # flag over file
    assert settings["commit_interval_s"] == 2.5 and settings["refresh_interval_s"] == 7
    from_env_file = resolved(env={"KVCAST_CONFIG": str(config)})
    assert from_env_file["namespace"] == "file"


def test_a_repeatable_flag_reads_its_variable_as_values_separated_by_spaces(
    tmp_path: Path,
) -> None:
    env = {"KVCAST_TARGET_HIT_RATIO": "0.6 0.9", "KVCAST_TIER": "host=2000 disk=9000"}
    settings = resolved(env=env)
    assert settings["target_hit_ratios"] == [0.6, 0.9]
    assert [t["name"] for t in settings["tiers"]] == ["host", "disk"]
    config = tmp_path / "kvcast.toml"
    config.write_text("target-hit-ratio = [0.8]\n")
    assert resolved("--config", str(config), env=env)["target_hit_ratios"] == [0.6, 0.9]
    assert resolved("--config", str(config))["target_hit_ratios"] == [0.8]
    refused = CliRunner().invoke(
        cli, ["run", "--print-config"], env={"KVCAST_TARGET_HIT_RATIO": "0.6 1.5"}
    )
    assert refused.exit_code == 2 and "KVCAST_TARGET_HIT_RATIO" in refused.output


def test_store_password_is_redacted() -> None:
    settings = resolved("--store", "redis://:s3cret@cache:6379/0")
    assert "s3cret" not in orjson.dumps(settings).decode()
    assert settings["store"] == "redis://:***@cache:6379/0"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("capacity_blocks = 5000\nbogus = 1\n", "unknown setting 'bogus'"),
        ("capacity-block = 5000\n", "did you mean 'capacity-blocks'?"),
        (
            "capacity_blocks = 0\n",
            "kvcast.toml: capacity_blocks = 0 (--capacity-blocks): must be an",
        ),
        ("target-hit-ratio = [0.5, 2.0]\n", "kvcast.toml: target-hit-ratio = [0.5, 2.0]"),
        ("capacity_blocks = [", "kvcast.toml"),
        ('capacity_blocks = "many"\n', "capacity-blocks"),
        ("capacity_blocks = 0\n", "capacity-blocks"),
    ],
)
def test_bad_config_files_are_named(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "kvcast.toml"
    config.write_text(content)
    result = CliRunner().invoke(cli, ["run", "--config", str(config), "--print-config"])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "nats://x/y"], "expected kafka://HOST:PORT/TOPIC"),
        (["--source", "kafka://broker:9092"], "expected kafka://HOST:PORT/TOPIC"),
        (["--store", "postgres://db"], "expected memory://, redis:// or rediss://"),
        (["--metrics-addr", "9400"], "expected HOST:PORT"),
        (["--namespace", "a b"], "namespace"),
        (["--commit-interval", "0"], "--commit-interval"),
        (["--target-hit-ratio", "1.2"], "--target-hit-ratio"),
        (["--max-uncommitted-events", "5"], "max_uncommitted_events"),
    ],
)
def test_bad_flags_are_named(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["run", *args, "--print-config"])
    assert result.exit_code == 2
    assert message in result.output


def test_a_bad_value_reads_the_same_from_every_layer_and_names_the_layer(tmp_path: Path) -> None:
    """The same rule and the same words for a flag, an environment variable and the config
    file; the environment and the file are named, the flag names itself."""
    config = tmp_path / "kvcast.toml"
    config.write_text("block-size = -100\n")
    runner = CliRunner()
    flag = runner.invoke(cli, ["run", "--block-size", "-100", "--print-config"])
    env = runner.invoke(cli, ["run", "--print-config"], env={"KVCAST_BLOCK_SIZE": "-100"})
    from_file = runner.invoke(cli, ["run", "--config", str(config), "--print-config"])
    rule = "must be an integer >= 1 (x>=1), got"
    for result in (flag, env, from_file):
        assert result.exit_code == 2 and rule in result.output
    assert "'--block-size'" in flag.output
    assert "(from KVCAST_BLOCK_SIZE)" in env.output
    assert f"{config}: block-size = -100 (--block-size)" in from_file.output
    for other in (["replay", str(config), "--block-size", "0"],
                  ["simulate", str(config), "--capacity-blocks", "0"],
                  ["forecast", "--lambda", "-5", "--capacity-blocks", "1"]):  # fmt: skip
        result = runner.invoke(cli, other)
        assert result.exit_code == 2 and "must be a" in result.output, result.output
