"""``kvcast run``: the daemon (SPEC sections 6-7).

Without ``--source`` it runs the embedded default: a generated intent-mixed workload replayed
in accelerated event time through the full pipeline, the in-memory store, HTTP on
127.0.0.1:9400 and a status line every few seconds. With ``--source kafka://...`` and
``--store redis://...`` it is the production sidecar.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import orjson
from click.core import ParameterSource

from kvcast.cli.demo import demo_source
from kvcast.cli.options import (
    TAXONOMY_FILE_HELP,
    declared_options,
    log_format_option,
    pop_declared,
    pop_stats_config,
    pop_tiers,
    read_taxonomy_file,
    stats_options,
    tier_options,
)
from kvcast.cli.secrets import hide_secrets_from_process_title, read_secret, with_password
from kvcast.daemon.assembly import (
    ENGINE_CAPACITY,
    AssemblyError,
    StopSignals,
    capacity_from_engines,
    run_daemon,
)
from kvcast.daemon.logs import LogConfig
from kvcast.daemon.settings import DaemonSettings, redact_url


def _load_config(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Eager: a TOML file becomes click's default_map (below env and flags, above defaults)."""
    if value is None:
        return None
    try:
        data = tomllib.loads(value.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"{value}: {exc}", ctx, param) from None
    # A key may be the flag's name (capacity-blocks) or the setting's (commit_interval_s).
    aliases: dict[str, str] = {}
    for option in ctx.command.params:
        if option.name and option.name not in ("config", "as_json", "print_config"):
            aliases[option.name] = option.name
            for flag in option.opts:
                aliases[flag.lstrip("-").replace("-", "_")] = option.name
    options = {option.name: option for option in ctx.command.params}
    defaults: dict[str, Any] = {}
    for key, setting in data.items():
        name = aliases.get(key.replace("-", "_"))
        if name is None:
            close = difflib.get_close_matches(key.replace("_", "-"), _flag_names(aliases), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise click.BadParameter(f"{value}: unknown setting {key!r}{hint}", ctx, param)
        option = options[name]
        try:  # the flag's own validation, so the message names the file and the key
            values = setting if option.multiple and isinstance(setting, list) else [setting]
            for item in values:
                option.type.convert(item, option, ctx)
        except click.BadParameter as exc:
            where = f"{value}: {key} = {setting!r} ({option.opts[0]})"
            raise click.BadParameter(f"{where}: {exc.message}", ctx, param) from None
        defaults[name] = setting
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _flag_names(aliases: dict[str, str]) -> list[str]:
    """The config keys as flag names (``capacity-blocks``), for suggestions."""
    return sorted({alias.replace("_", "-") for alias in aliases})


@click.command("run")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    callback=_load_config,
    is_eager=True,
    expose_value=False,
    envvar="KVCAST_CONFIG",
    show_envvar=True,
    help="TOML file of settings (keys are flag names); flags and KVCAST_* win over it.",
)
@declared_options()
@stats_options
@tier_options
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="KVCAST_LOG_LEVEL",
    show_envvar=True,
)
@log_format_option
@click.option(
    "--print-config",
    is_flag=True,
    help="Print the resolved settings (flags > KVCAST_* > --config file > defaults) and exit.",
)
@click.option(
    "--store-password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="KVCAST_STORE_PASSWORD_FILE",
    show_envvar=True,
    help="File whose first line is the Redis password (keeps it out of the process list).",
)
@click.option(
    "--kafka-sasl-password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="KVCAST_KAFKA_SASL_PASSWORD_FILE",
    show_envvar=True,
    help="File whose first line is the Kafka SASL password.",
)
@click.option(
    "--taxonomy-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    envvar="KVCAST_TAXONOMY_FILE",
    show_envvar=True,
    help=TAXONOMY_FILE_HELP,
)
@click.option("--json", "as_json", is_flag=True, help="Status lines as JSON objects.")
def run(log_level: str, log_format: str, as_json: bool, print_config: bool, **kwargs: Any) -> None:
    """Run the daemon: consume events, keep statistics, publish forecast and table."""
    logs = LogConfig(log_level, log_format)
    logs.configure()
    signals = StopSignals().install()  # from here on SIGTERM drains, whenever it comes
    hide_secrets_from_process_title(sys.argv)
    stats = pop_stats_config(kwargs)
    kwargs["tiers"], kwargs["tier_mode"] = pop_tiers(kwargs, kwargs["capacity_blocks"])
    kwargs.update(pop_declared(kwargs))
    try:
        _read_password_files(kwargs)
        taxonomy_file = kwargs.pop("taxonomy_file")
        if taxonomy_file is not None:
            kwargs["extra_intents"] = read_taxonomy_file(taxonomy_file)
        settings = DaemonSettings(stats=stats, **kwargs)
        given = _given(click.get_current_context(), ENGINE_CAPACITY)
        settings = capacity_from_engines(settings, given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if print_config:
        resolved = dataclasses.asdict(settings)
        resolved["store"] = redact_url(settings.store)
        if settings.kafka_sasl_password is not None:
            resolved["kafka_sasl_password"] = "***"
        click.echo(orjson.dumps(resolved, option=orjson.OPT_INDENT_2).decode())
        return
    try:
        code = run_daemon(settings, demo_source, status_json=as_json, logs=logs, signals=signals)
    except AssemblyError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(code)


def _given(ctx: click.Context, names: tuple[str, ...]) -> set[str]:
    """Those of ``names`` that a flag, a ``KVCAST_*`` variable or the config file set."""
    return {name for name in names if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT}


def _read_password_files(kwargs: dict[str, Any]) -> None:
    """Put the passwords of ``--store-password-file`` and ``--kafka-sasl-password-file`` in
    their settings (ValueError naming the file or the conflict)."""
    store_file = kwargs.pop("store_password_file")
    if store_file is not None:
        password = read_secret(store_file, "--store-password-file")
        kwargs["store"] = with_password(kwargs["store"], password)
    kafka_file = kwargs.pop("kafka_sasl_password_file")
    if kafka_file is not None:
        if kwargs.get("kafka_sasl_password") is not None:
            raise ValueError("--kafka-sasl-password-file: a password was given already")
        kwargs["kafka_sasl_password"] = read_secret(kafka_file, "--kafka-sasl-password-file")
