"""Kafka connection security settings reach kafka-python unchanged; the password never prints.

The test broker (tansu) offers no SASL mechanism and no TLS, so a full authenticated session
cannot be exercised here: what is checked is that the settings reach kafka-python and that it
starts the SASL handshake they ask for.
"""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import open_source
from kvcast.lab.bench.processes import wait_until


def test_settings_map_to_kafka_python_options() -> None:
    settings = DaemonSettings(
        source="kafka://broker:9093/requests",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="kvcast",
        kafka_sasl_password="s3cret",
        kafka_ssl_cafile="/etc/kafka/ca.pem",
    )
    assert settings.kafka_options() == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "kvcast",
        "sasl_plain_password": "s3cret",
        "ssl_cafile": "/etc/kafka/ca.pem",
    }
    assert DaemonSettings().kafka_options() == {}


def test_the_consumer_speaks_sasl_with_them(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    # tansu offers no SASL mechanism: the handshake kafka-python attempts is refused, which
    # shows the settings went over the wire. The source keeps retrying in the background (the
    # daemon stays up) and says why it is not ready, without the password.
    caplog.set_level(logging.ERROR, logger="kafka")
    source = open_source(
        f"kafka://{kafka_bootstrap}/t",
        "g",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="kvcast",
        sasl_plain_password="s3cret",
        bootstrap_timeout_ms=3000,
    )
    try:
        wait_until(lambda: "KafkaTimeoutError" in source.health()[1], 20, "the bootstrap to fail")
        healthy, detail = source.health()
        assert not healthy and f"kafka broker {kafka_bootstrap} unreachable" in detail
        assert source.poll(0.1, 10) == []
    finally:
        source.close()
    assert "SaslHandshake failed: UnsupportedSaslMechanismError" in caplog.text
    assert "s3cret" not in caplog.text and "s3cret" not in detail


def test_bad_values_are_named_and_the_password_is_redacted() -> None:
    result = CliRunner().invoke(cli, ["run", "--kafka-security-protocol", "TLS", "--print-config"])
    assert result.exit_code == 2 and "--kafka-security-protocol" in result.output
    result = CliRunner().invoke(
        cli, ["run", "--print-config"], env={"KVCAST_KAFKA_SASL_PASSWORD": "s3cret"}
    )
    assert result.exit_code == 0 and "s3cret" not in result.output
    assert "s3cret" not in CliRunner().invoke(cli, ["run", "--help"]).output
