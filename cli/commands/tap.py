"""``kvcast tap``: the OpenAI-compatible proxy that feeds kvcast (``kvcast.daemon.tap``)."""

from __future__ import annotations

from pathlib import Path

import click

from kvcast.cli.options import log_format_option
from kvcast.daemon.logs import LogConfig
from kvcast.daemon.tap import Tap, run_tap
from kvcast.producer import EventBuilder, KafkaEventProducer
from kvcast.producer.kafka import kafka_topic_of


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param_hint="'--listen'")
    return host, int(port)


@click.command("tap")
@click.option(
    "--listen",
    default="127.0.0.1:8001",
    show_default=True,
    envvar="KVCAST_TAP_LISTEN",
    help="HOST:PORT the proxy serves the OpenAI-compatible API on.",
)
@click.option(
    "--upstream",
    required=True,
    envvar="KVCAST_TAP_UPSTREAM",
    help="The engine's OpenAI-compatible server, e.g. http://127.0.0.1:8000.",
)
@click.option(
    "--source",
    required=True,
    envvar="KVCAST_SOURCE",
    help="Where the events go: kafka://HOST:PORT/TOPIC (the topic kvcast run reads).",
)
@click.option(
    "--hash-key-file",
    required=True,
    envvar="KVCAST_HASH_KEY_FILE",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The deployment's secret for block and history hashes (16+ bytes; the same "
    "file for every tap replica).",
)
@click.option(
    "--block-size",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="KVCAST_BLOCK_SIZE",
    help="Tokens per KV block of the engine.",
)
@click.option(
    "--include-text/--no-include-text",
    default=False,
    show_default=True,
    help="Send the messages along for kvcast's intent classifier (user text!).",
)
@click.option("--instance", default=None, help="The engine instance's name, on every event.")
@log_format_option
def tap_command(listen: str, upstream: str, source: str, hash_key_file: Path, block_size: int,
                include_text: bool, instance: str | None, log_format: str) -> None:  # fmt: skip
    """Proxy an OpenAI-compatible engine (vLLM, SGLang) and send kvcast an event per request.

    /v1/chat/completions and /v1/completions (streaming or not) are forwarded and turned into
    events; every other path is passed through. Point clients at --listen instead of the engine.
    """
    host, port = _listen(listen)
    if not upstream.startswith(("http://", "https://")):
        raise click.BadParameter(
            f"{upstream!r} is not an http(s):// URL", param_hint="'--upstream'"
        )
    try:
        bootstrap, topic = kafka_topic_of(source)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--source'") from None
    secret = hash_key_file.read_bytes().strip()
    try:
        builder = EventBuilder(secret, block_size=block_size, include_text=include_text,
                               instance=instance)  # fmt: skip
    except ValueError as exc:
        raise click.BadParameter(
            f"{hash_key_file}: {exc}", param_hint="'--hash-key-file'"
        ) from None
    LogConfig("info", log_format).configure()
    producer = KafkaEventProducer(bootstrap, topic, builder)
    try:
        run_tap(Tap(upstream, producer), host, port)
    finally:
        producer.close()
        click.echo(f"kvcast tap: {producer.sent} events sent, {producer.dropped} dropped", err=True)
