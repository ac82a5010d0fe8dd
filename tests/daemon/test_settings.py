"""Each setting of ``kvcast run`` declared once: the flag, the variable, the config key, the
bounds and the check all come from the ``Setting`` (kvcast.stats.declarations) of its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.daemon.settings import DaemonSettings, declared
from kvcast.stats.declarations import Choice, Number, Setting

DECLARED = {found.name: how for found, how in declared()}


def _outside(kind: Number) -> list[Any]:
    """Values just past each bound of ``kind`` (the bound itself when it is open)."""
    step = 1 if kind.type is int else 1e-3
    values = []
    if kind.min is not None:
        values.append(kind.min if kind.min_open else kind.min - step)
    if kind.max is not None:
        values.append(kind.max if kind.max_open else kind.max + step)
    return values


def _cli_value(how: Setting, value: Any) -> list[str]:
    return [how.flag, str(value)]


BOUNDED = [
    (name, value)
    for name, how in DECLARED.items()
    if isinstance(how.kind, Number)
    for value in _outside(how.kind)
]


def test_every_bounded_setting_is_checked() -> None:
    # capacity, instances, bytes per token, workers, the intervals, sampling, hit ratios, ...
    assert {name for name, _ in BOUNDED} >= {"workers", "commit_interval_s", "shadow_sampling",
                                            "target_hit_ratios", "capacity_blocks"}  # fmt: skip


@pytest.mark.parametrize(("name", "value"), BOUNDED)
def test_a_value_past_a_declared_bound_is_refused_by_the_settings_and_the_cli(
    name: str, value: Any, tmp_path: Path
) -> None:
    how = DECLARED[name]
    with pytest.raises(ValueError) as refused:
        DaemonSettings(**{name: (value,) if how.many else value})
    message = str(refused.value)  # this setting's problem alone: others read only good values
    assert message.startswith(f"{name} must be {how.kind.describe()}, got")
    assert message.endswith(f"(set by {how.where()})") and f"config key {how.key})" in message
    assert how.flag in message and (how.envvar is None or how.envvar in message)
    runner = CliRunner()
    flag = runner.invoke(cli, ["run", *_cli_value(how, value), "--print-config"])
    assert flag.exit_code == 2 and how.flag in flag.output, flag.output
    config = tmp_path / "kvcast.toml"
    config.write_text(f"{how.key} = {[value] if how.many else value!r}\n")
    from_file = runner.invoke(cli, ["run", "--config", str(config), "--print-config"])
    assert from_file.exit_code == 2 and f"{how.key} = " in from_file.output, from_file.output
    if how.envvar is not None:
        env = runner.invoke(cli, ["run", "--print-config"], env={how.envvar: str(value)})
        assert env.exit_code == 2 and f"(from {how.envvar})" in env.output, env.output


CHOICES = [name for name, how in DECLARED.items() if isinstance(how.kind, Choice)]


@pytest.mark.parametrize("name", CHOICES)
def test_every_declared_choice_is_accepted_and_nothing_else(name: str) -> None:
    how = DECLARED[name]
    assert isinstance(how.kind, Choice)
    for choice in how.kind.values:
        resolved = CliRunner().invoke(cli, ["run", how.flag, str(choice), "--print-config"])
        assert resolved.exit_code == 0, resolved.output
        assert getattr(DaemonSettings(**{name: choice}), name) == choice
    with pytest.raises(ValueError, match=rf"^{name} must be .* got 'bogus' \(set by {how.flag}"):
        DaemonSettings(**{name: "bogus"})
    refused = CliRunner().invoke(cli, ["run", how.flag, "bogus", "--print-config"])
    assert refused.exit_code == 2 and how.flag in refused.output


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"namespace": "a b"}, "namespace 'a b': use 1-64 of"),
        ({"source": "nats://x/y"}, "source 'nats://x/y': expected kafka://HOST:PORT/TOPIC"),
        ({"store": "postgres://db"}, "store URL 'postgres://db': unknown scheme"),
        ({"metrics_addr": "9400"}, "metrics_addr '9400': expected HOST:PORT"),
        ({"engine_metrics": ("ftp://x",)}, "engine_metrics 'ftp://x': expected http://"),
        ({"group_id": ""}, "group_id must not be empty"),
    ],
)
def test_a_declared_check_says_what_is_wrong_and_where_it_is_set(
    changes: dict[str, Any], message: str
) -> None:
    (name,) = changes
    how = DECLARED[name]
    with pytest.raises(ValueError) as refused:
        DaemonSettings(**changes)
    assert str(refused.value) == f"{message}{str(refused.value)[len(message) :]}"
    assert str(refused.value).endswith(f"(set by {how.where()})")


def test_settings_between_settings_are_checked_too() -> None:
    with pytest.raises(ValueError, match="max_uncommitted_events must be >= commit_max_events"):
        DaemonSettings(commit_max_events=10, max_uncommitted_events=5)
    with pytest.raises(ValueError, match="workers 2 needs a kafka:// source"):
        DaemonSettings(workers=2)


def test_where_names_the_flag_the_variable_and_the_key() -> None:
    assert DECLARED["commit_interval_s"].where() == (
        "--commit-interval, KVCAST_COMMIT_INTERVAL or config key commit-interval"
    )
    assert DECLARED["target_hit_ratios"].where() == (
        "--target-hit-ratio, KVCAST_TARGET_HIT_RATIO or config key target-hit-ratio"
    )
