"""``kvcast run``'s public surface: every flag, environment variable, config key and default.

The chart (``deploy/helm``), the docs and deployments name these; the list below was taken from
the command as it stood before its settings were declared once (issue 35), so that generating
the options from the declarations cannot rename, drop or re-default one unnoticed.
"""

# ruff: noqa: E501 (SURFACE_TABLE's rows are read as a table)
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import click
import orjson
from click.testing import CliRunner

from kvcast.cli.commands.run import run
from kvcast.cli.main import cli

# One row a flag: the flag, its parameter, its environment variable and its default as Python
# writes it; "-": none.
SURFACE_TABLE = """
--config                    config                      KVCAST_CONFIG                       -
--source                    source                      KVCAST_SOURCE                       -
--store                     store                       KVCAST_STORE                        'memory://'
--group-id                  group_id                    KVCAST_GROUP_ID                     -
--namespace                 namespace                   KVCAST_NAMESPACE                    'kvcast'
--partition-assignment      partition_assignment        KVCAST_PARTITION_ASSIGNMENT         'cooperative-sticky'
--metrics-addr              metrics_addr                KVCAST_METRICS_ADDR                 '127.0.0.1:9400'
--workers                   workers                     KVCAST_WORKERS                      1
--commit-interval           commit_interval_s           KVCAST_COMMIT_INTERVAL              1.0
--commit-max-events         commit_max_events           KVCAST_COMMIT_MAX_EVENTS            10000
--max-uncommitted-events    max_uncommitted_events      KVCAST_MAX_UNCOMMITTED_EVENTS       200000
--refresh-interval          refresh_interval_s          KVCAST_REFRESH_INTERVAL             5.0
--table-interval            table_interval_s            KVCAST_TABLE_INTERVAL               10.0
--status-interval           status_interval_s           KVCAST_STATUS_INTERVAL              5.0
--max-backoff               max_backoff_s               KVCAST_MAX_BACKOFF                  30.0
--shutdown-timeout          shutdown_timeout_s          KVCAST_SHUTDOWN_TIMEOUT             10.0
--classifier                classifier                  KVCAST_CLASSIFIER                   'auto'
--classifier-budget         classifier_budget_s         KVCAST_CLASSIFIER_BUDGET            0.05
--classifier-backbone       classifier_backbone         KVCAST_CLASSIFIER_BACKBONE          -
--classifier-head           classifier_head             KVCAST_CLASSIFIER_HEAD              -
--taxonomy                  taxonomy                    KVCAST_TAXONOMY                     30
--kafka-security-protocol   kafka_security_protocol     KVCAST_KAFKA_SECURITY_PROTOCOL      -
--kafka-sasl-mechanism      kafka_sasl_mechanism        KVCAST_KAFKA_SASL_MECHANISM         -
--kafka-sasl-username       kafka_sasl_username         KVCAST_KAFKA_SASL_USERNAME          -
--kafka-sasl-password       kafka_sasl_password         KVCAST_KAFKA_SASL_PASSWORD          -
--kafka-ssl-cafile          kafka_ssl_cafile            KVCAST_KAFKA_SSL_CAFILE             -
--kafka-ssl-certfile        kafka_ssl_certfile          KVCAST_KAFKA_SSL_CERTFILE           -
--kafka-ssl-keyfile         kafka_ssl_keyfile           KVCAST_KAFKA_SSL_KEYFILE            -
--dead-letter-topic         dead_letter_topic           KVCAST_DEAD_LETTER_TOPIC            -
--shadow-sampling           shadow_sampling             KVCAST_SHADOW_SAMPLING              0.05
--engine-scrape-interval    engine_scrape_interval_s    KVCAST_ENGINE_SCRAPE_INTERVAL       15.0
--speedup                   speedup                     KVCAST_SPEEDUP                      240.0
--sample-conversations      sample_conversations        KVCAST_SAMPLE_CONVERSATIONS         20000
--block-size                block_size                  KVCAST_BLOCK_SIZE                   16
--completion-timeout        completion_timeout_s        KVCAST_COMPLETION_TIMEOUT           1800.0
--allowed-lateness          allowed_lateness_s          KVCAST_ALLOWED_LATENESS             60.0
--max-future-skew           max_future_skew_s           KVCAST_MAX_FUTURE_SKEW              3600.0
--max-turn                  max_turn                    KVCAST_MAX_TURN                     32
--window-conversations      window_conversations        KVCAST_WINDOW_CONVERSATIONS         10000
--window-max-age            window_max_age_s            KVCAST_WINDOW_MAX_AGE               86400.0
--rate-window               rate_window_s               KVCAST_RATE_WINDOW                  600
--max-open-conversations    max_open_conversations      KVCAST_MAX_OPEN_CONVERSATIONS       1000000
--min-delay-samples         min_delay_samples           KVCAST_MIN_DELAY_SAMPLES            2
--shared-index-blocks       shared_index_blocks         KVCAST_SHARED_INDEX_BLOCKS          1000000
--shared-index-dense-tokens shared_index_dense_tokens   KVCAST_SHARED_INDEX_DENSE_TOKENS    256
--state-intent              state_intent                KVCAST_STATE_INTENT                 'auto'
--capacity-blocks           capacity_blocks             KVCAST_CAPACITY_BLOCKS              2275
--instances                 instances                   KVCAST_INSTANCES                    1
--kv-bytes-per-token        kv_bytes_per_token          KVCAST_KV_BYTES_PER_TOKEN           -
--tier                      tiers                       KVCAST_TIER                         -
--tier-mode                 tier_mode                   KVCAST_TIER_MODE                    'exclusive'
--target-hit-ratio          target_hit_ratios           KVCAST_TARGET_HIT_RATIO             (0.5, 0.7)
--log-level                 log_level                   KVCAST_LOG_LEVEL                    'info'
--log-format                log_format                  KVCAST_LOG_FORMAT                   'text'
--print-config              print_config                -                                   -
--store-password-file       store_password_file         KVCAST_STORE_PASSWORD_FILE          -
--kafka-sasl-password-file  kafka_sasl_password_file    KVCAST_KAFKA_SASL_PASSWORD_FILE     -
--taxonomy-file             taxonomy_file               KVCAST_TAXONOMY_FILE                -
--engine-metrics            engine_metrics              KVCAST_ENGINE_METRICS               -
--json                      as_json                     -                                   -
"""
SURFACE = tuple(
    (flag, name, None if env == "-" else env, None if default == "-" else ast.literal_eval(default))
    for flag, name, env, default in (
        row.split(maxsplit=3) for row in SURFACE_TABLE.split("\n")[1:-1]
    )
)
# Not config keys: the file itself and what only changes what the command prints.
NOT_KEYS = {"config", "print_config", "as_json"}


def _default(option: click.Option) -> Any:
    if option.is_flag or option.default in (None, click.core.UNSET) or option.default == ():
        return None
    return tuple(option.default) if option.multiple else option.default


def test_the_flags_variables_and_defaults_are_those_users_know() -> None:
    options = [p for p in run.params if isinstance(p, click.Option)]
    found = {(o.opts[0], o.name, o.envvar, _default(o)) for o in options}
    assert found == set(SURFACE)
    assert all(len(o.opts) == 1 for o in options)  # no second spelling of a flag


def _toml(value: Any) -> str:
    return orjson.dumps(list(value) if isinstance(value, tuple) else value).decode()


def test_every_setting_is_a_config_key_under_its_flag_and_its_name(tmp_path: Path) -> None:
    """A file of every setting that has a default, by flag name and by parameter name, is
    accepted and resolves to the defaults (a key that is not a setting is refused)."""
    defaults = CliRunner().invoke(cli, ["run", "--print-config"])
    assert defaults.exit_code == 0, defaults.output
    for spelling in (lambda flag, name: flag.lstrip("-"), lambda flag, name: name):
        lines = [
            f"{spelling(flag, name)} = {_toml(default)}"
            for flag, name, _, default in SURFACE
            if default is not None and name not in NOT_KEYS
        ]
        config = tmp_path / "kvcast.toml"
        config.write_text("\n".join(lines) + "\n")
        result = CliRunner().invoke(cli, ["run", "--config", str(config), "--print-config"])
        assert result.exit_code == 0, result.output
        assert orjson.loads(result.stdout) == orjson.loads(defaults.stdout)
    for name in sorted(NOT_KEYS - {"config"}):
        config.write_text(f"{name} = true\n")
        result = CliRunner().invoke(cli, ["run", "--config", str(config), "--print-config"])
        assert result.exit_code == 2 and f"unknown setting {name!r}" in result.output
