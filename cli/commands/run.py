"""``kvcast run``: the daemon (SPEC sections 6-7).

Without ``--source`` it runs the embedded default: a generated intent-mixed workload replayed
in accelerated event time through the full pipeline, the in-memory store, HTTP on
127.0.0.1:9400 and a status line every few seconds. With ``--source kafka://...`` and
``--store redis://...`` it is the production sidecar.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import signal
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import orjson
from click.core import ParameterSource

from kvcast.cli.demo import demo_source
from kvcast.cli.options import (
    TAXONOMY_CHOICE,
    TAXONOMY_FILE_HELP,
    TAXONOMY_HELP,
    Floats,
    Ints,
    capacity_options,
    envvar_for,
    log_format_option,
    pop_stats_config,
    pop_tiers,
    read_taxonomy_file,
    stats_options,
    tier_options,
)
from kvcast.cli.secrets import hide_secrets_from_process_title, read_secret, with_password
from kvcast.daemon.engine_metrics import engine_capacity
from kvcast.daemon.gc_tuning import tune_for_streaming
from kvcast.daemon.instance import build_instance, open_store_and_source
from kvcast.daemon.logs import LogConfig
from kvcast.daemon.settings import MAX_WORKERS, DaemonSettings, redact_url
from kvcast.daemon.workers import WorkerPool
from kvcast.exporters.http_server import HttpServer
from kvcast.exporters.metrics import build_registry

_DEFAULTS = DaemonSettings()
# Defaults that depend on other settings: None on the command line, resolved by DaemonSettings.
_DERIVED = frozenset({"group_id"})

# (flag, settings field, click type, help); each reads KVCAST_<FLAG> from the environment.
_RUN_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--source", "source", str, "kafka://HOST:PORT/TOPIC or file://PATH; none: embedded default."),
    (
        "--store",
        "store",
        str,
        "memory://, redis://[:PASSWORD@]HOST:PORT/DB, redis+cluster://HOST:PORT[,HOST:PORT...]"
        " or redis+sentinel://HOST:PORT[,...]/SERVICE (rediss... for TLS).",
    ),
    (
        "--group-id",
        "group_id",
        str,
        "Kafka consumer group (default: kvcast.NAMESPACE.TOPIC, one per deployment).",
    ),
    ("--namespace", "namespace", str, "Prefix of every Redis key."),
    (
        "--partition-assignment",
        "partition_assignment",
        click.Choice(["cooperative-sticky", "range"]),
        "How the consumer group spreads partitions; cooperative-sticky moves only what must "
        "move when a replica joins or leaves. Every replica of a group must use the same.",
    ),
    ("--metrics-addr", "metrics_addr", str, "HOST:PORT of the HTTP server (/metrics, /v1/...)."),
    (
        "--workers",
        "workers",
        Ints(min=1, max=MAX_WORKERS),
        "Processes consuming for this instance (kafka:// and redis:// only); see README.",
    ),
    (
        "--commit-interval",
        "commit_interval_s",
        Floats(min=0, min_open=True),
        "Seconds between atomic state commits.",
    ),
    (
        "--commit-max-events",
        "commit_max_events",
        Ints(min=1),
        "Commit after this many events even before the interval.",
    ),
    (
        "--max-uncommitted-events",
        "max_uncommitted_events",
        Ints(min=1),
        "Stop consuming while this many applied events await the store.",
    ),
    (
        "--refresh-interval",
        "refresh_interval_s",
        Floats(min=0, min_open=True),
        "Seconds between forecast recomputations.",
    ),
    (
        "--table-interval",
        "table_interval_s",
        Floats(min=0, min_open=True),
        "Minimum seconds between table publications (only when it changed).",
    ),
    (
        "--status-interval",
        "status_interval_s",
        Floats(min=0, min_open=True),
        "Seconds between status lines.",
    ),
    (
        "--max-backoff",
        "max_backoff_s",
        Floats(min=0, min_open=True),
        "Longest wait (s) between retries while the store is unreachable.",
    ),
    (
        "--shutdown-timeout",
        "shutdown_timeout_s",
        Floats(min=0, min_open=True),
        "Seconds SIGTERM may spend storing what was applied.",
    ),
    (
        "--classifier",
        "classifier",
        click.Choice(["off", "auto", "on"]),
        "Classify events without an intent: auto = when installed (never for the embedded"
        " default, whose events carry intents).",
    ),
    (
        "--classifier-budget",
        "classifier_budget_s",
        Floats(min=0, min_open=True),
        "Seconds a poll's events may wait for the classifier; the rest count as unknown.",
    ),
    ("--classifier-backbone", "classifier_backbone", str, "Embedding model: local path or name."),
    ("--classifier-head", "classifier_head", str, "Trained head file (default: shipped)."),
    ("--taxonomy", "taxonomy", TAXONOMY_CHOICE, TAXONOMY_HELP),
    (
        "--kafka-security-protocol",
        "kafka_security_protocol",
        click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
        "Kafka connection security (kafka-python's security_protocol).",
    ),
    (
        "--kafka-sasl-mechanism",
        "kafka_sasl_mechanism",
        click.Choice(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
        "Kafka SASL mechanism.",
    ),
    ("--kafka-sasl-username", "kafka_sasl_username", str, "Kafka SASL user."),
    (
        "--kafka-sasl-password",
        "kafka_sasl_password",
        str,
        "Kafka SASL password; set it in the environment variable rather than on the command line.",
    ),
    ("--kafka-ssl-cafile", "kafka_ssl_cafile", str, "CA certificate file for Kafka TLS."),
    ("--kafka-ssl-certfile", "kafka_ssl_certfile", str, "Client certificate file for Kafka TLS."),
    ("--kafka-ssl-keyfile", "kafka_ssl_keyfile", str, "Client key file for Kafka TLS."),
    (
        "--dead-letter-topic",
        "dead_letter_topic",
        str,
        "Kafka topic for rejected records as they arrived (the source's brokers), or "
        "kafka://HOST:PORT/TOPIC; committed with their partition.",
    ),
    (
        "--shadow-sampling",
        "shadow_sampling",
        Floats(min=0, max=1),
        "Fraction of KV blocks the shadow LRU simulation keeps (its measured hit-ratio curve"
        " beside the forecast); 0 turns it off.",
    ),
    (
        "--engine-scrape-interval",
        "engine_scrape_interval_s",
        Floats(min=0, min_open=True),
        "Seconds between scrapes of the --engine-metrics endpoints.",
    ),
    (
        "--speedup",
        "speedup",
        Floats(min=0, min_open=True),
        "Embedded default: event-time seconds replayed per wall second.",
    ),
    (
        "--sample-conversations",
        "sample_conversations",
        Ints(min=1),
        "Embedded default: conversations in the generated workload.",
    ),
)


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


def _run_options(command: Any) -> Any:
    for flag, name, kind, help_text in reversed(_RUN_FLAGS):
        default = None if name in _DERIVED else getattr(_DEFAULTS, name)
        command = click.option(
            flag,
            name,
            type=kind,
            default=default,
            show_default=default is not None,
            envvar=envvar_for(flag),
            show_envvar=True,
            help=help_text,
        )(command)
    return command


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
@_run_options
@stats_options
@capacity_options
@tier_options
@click.option(
    "--target-hit-ratio",
    "target_hit_ratios",
    type=Floats(min=0, max=1, min_open=True, max_open=True),
    multiple=True,
    default=_DEFAULTS.target_hit_ratios,
    show_default=True,
    help="Hit ratios to report the needed capacity for (repeatable).",
)
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
@click.option(
    "--engine-metrics",
    default=None,
    envvar="KVCAST_ENGINE_METRICS",
    show_envvar=True,
    help="Engines' Prometheus endpoints, comma-separated (http://HOST:PORT/metrics): their hit "
    "ratio is exported beside the forecast, and vLLM's capacity and block size are taken when "
    "--capacity-blocks and --block-size are not given.",
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
    kwargs["target_hit_ratios"] = tuple(kwargs["target_hit_ratios"])
    kwargs["taxonomy"] = int(kwargs["taxonomy"])
    try:
        _read_password_files(kwargs)
        taxonomy_file = kwargs.pop("taxonomy_file")
        if taxonomy_file is not None:
            kwargs["extra_intents"] = read_taxonomy_file(taxonomy_file)
        kwargs["engine_metrics"] = _engine_urls(kwargs.pop("engine_metrics"))
        settings = DaemonSettings(stats=stats, **kwargs)
        if settings.engine_metrics:
            settings = _capacity_from_engines(settings, click.get_current_context())
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
        store, source = open_store_and_source(settings, demo_source)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    tune_for_streaming()
    sys.exit(serve(settings, store, source, status_json=as_json, logs=logs, signals=signals))


def _engine_urls(value: str | None) -> tuple[str, ...]:
    return tuple(url.strip() for url in (value or "").split(",") if url.strip())


def _capacity_from_engines(settings: DaemonSettings, ctx: click.Context) -> DaemonSettings:
    """Capacity, block size and instances from vLLM's ``cache_config_info`` where no flag,
    ``KVCAST_*`` variable or config key gave them (ValueError naming the endpoints)."""
    given = {
        name
        for name in ("capacity_blocks", "block_size", "instances")
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    }
    if {"capacity_blocks", "block_size"} <= given:
        return settings
    blocks, block_size, engines = engine_capacity(settings.engine_metrics)
    changes: dict[str, Any] = {}
    if "capacity_blocks" not in given:
        changes["capacity_blocks"] = blocks
    if "block_size" not in given:
        changes["stats"] = dataclasses.replace(settings.stats, block_size=block_size)
    if "instances" not in given:
        changes["instances"] = engines
    taken = {"capacity_blocks": blocks, "block_size": block_size, "instances": engines}
    logging.getLogger(__name__).info(
        "from the engines' vllm:cache_config_info: %s",
        ", ".join(f"{name}={value}" for name, value in taken.items() if name not in given),
    )
    return dataclasses.replace(settings, **changes)


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


class StopSignals:
    """SIGTERM and SIGINT from the moment ``kvcast run`` starts: remembered while the process is
    still being built (settings, store, classifier), passed to the loop once it exists, so that
    a signal at any moment drains and exits 0 instead of killing the process (exit 143)."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._target: Callable[[], None] | None = None

    def install(self) -> StopSignals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, _frame: object = None) -> None:
        self.received.append(signal.Signals(signum).name)
        if self._target is not None:
            self._target()

    def attach(self, target: Callable[[], None]) -> None:
        """From now on a signal calls ``target``; one that came before calls it at once."""
        self._target = target
        if self.received:
            target()


def serve(
    settings: DaemonSettings,
    store: Any,
    source: Any,
    status_json: bool = False,
    logs: LogConfig | None = None,
    signals: StopSignals | None = None,
) -> int:
    """Wire this process, its workers, HTTP and signals; run until SIGTERM/SIGINT."""
    signals = signals or StopSignals().install()
    try:
        instance = build_instance(settings, store, source, status_out=sys.stdout)
    except RuntimeError as exc:
        raise click.UsageError(f"--classifier on: {exc}") from None
    daemon, published = instance.daemon, instance.publisher.published
    daemon.status_json = status_json
    pool = None
    if settings.workers > 1:

        def worker_failed(reason: str) -> None:
            published.set_component("workers", reason)  # /readyz names it while draining
            daemon.request_stop()

        pool = WorkerPool(settings, logs or LogConfig(), on_failure=worker_failed)
        published.set_component("workers", "ok")
    view = (
        published.metrics_view
        if pool is None
        else lambda: pool.merge_into(published.metrics_view())
    )
    host, port = settings.http_host_port()
    http = HttpServer(host, port, published, build_registry(view))
    try:
        http.start()
    except OSError as exc:
        instance.close()
        raise click.UsageError(f"--metrics-addr {settings.metrics_addr}: {exc}") from None

    stopped_by = signals.received

    def stop() -> None:
        daemon.request_stop()
        if pool is not None:
            pool.request_stop()

    signals.attach(stop)
    mode = "embedded default" if settings.embedded else f"source {settings.source}"
    workers = f", {settings.workers} processes" if pool is not None else ""
    click.echo(
        f"kvcast: {mode}, store {redact_url(settings.store)}{workers}, serving {http.url}",
        err=True,
    )
    code = 1
    try:
        if pool is not None:
            pool.start()
        code = daemon.run()
    finally:
        if pool is not None:
            code = max(code, pool.stop(settings.shutdown_timeout_s + 10))
        http.close()
        instance.close()
        why = f"on {stopped_by[0]}" if stopped_by else "at the end of its source"
        click.echo(
            f"kvcast: stopped {why}: {daemon.events_seen:,} events applied, "
            f"{'everything stored' if code == 0 else 'exit status ' + str(code)}",
            err=True,
        )
    return code
