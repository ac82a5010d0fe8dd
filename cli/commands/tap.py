"""``kvcast tap``: the OpenAI-compatible proxy that feeds kvcast (``kvcast.daemon.tap``)."""

from __future__ import annotations

import logging
import resource
from pathlib import Path

import click

from kvcast.cli.options import Floats, Ints, log_format_option
from kvcast.daemon.logs import LogConfig
from kvcast.daemon.tap import MAX_BODY_BYTES, Tap, TapLimits, run_tap
from kvcast.producer import EventBuilder, KafkaEventProducer
from kvcast.producer.endings import AGENT_INTENT_MODES
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
@click.option(
    "--max-connections",
    default=4096,
    show_default=True,
    type=Ints(min=1),
    envvar="KVCAST_TAP_MAX_CONNECTIONS",
    help="Requests upstream at once (more wait for a connection). Needs about two file "
    "descriptors each: the tap raises its soft limit as far as the hard one allows.",
)
@click.option(
    "--connect-timeout",
    default=10.0,
    show_default=True,
    type=Floats(min=0, finite=True),
    envvar="KVCAST_TAP_CONNECT_TIMEOUT",
    help="Seconds to open an upstream connection (0: no limit); beyond: 504.",
)
@click.option(
    "--first-byte-timeout",
    default=600.0,
    show_default=True,
    type=Floats(min=0, finite=True),
    envvar="KVCAST_TAP_FIRST_BYTE_TIMEOUT",
    help="Seconds from sending a request to the response's headers (a non-streamed "
    "request: its whole generation; 0: no limit); beyond: 504.",
)
@click.option(
    "--idle-timeout",
    default=600.0,
    show_default=True,
    type=Floats(min=0, finite=True),
    envvar="KVCAST_TAP_IDLE_TIMEOUT",
    help="Seconds between two chunks of a response (0: no limit); beyond, the response is "
    "cut. There is no limit on a response's total time.",
)
@click.option(
    "--max-body-bytes",
    default=MAX_BODY_BYTES,
    show_default=True,
    type=Ints(min=1),
    envvar="KVCAST_TAP_MAX_BODY_BYTES",
    help="Largest request body (bytes); larger: 413.",
)
@click.option(
    "--max-event-bytes",
    default=16 << 20,
    show_default=True,
    type=Ints(min=1),
    envvar="KVCAST_TAP_MAX_EVENT_BYTES",
    help="Bytes of a response kept to build its event; beyond, that event is dropped "
    "(counted, logged) and the response is relayed all the same.",
)
@click.option(
    "--identity-header",
    "identity_headers",
    multiple=True,
    envvar="KVCAST_TAP_IDENTITY_HEADER",
    help="Request header naming the user or session (repeatable or comma-separated, e.g. "
    "x-user-id,x-session-id): the first present becomes the event's identity.",
)
@click.option(
    "--agent-intents",
    default="tools",
    show_default=True,
    type=click.Choice(AGENT_INTENT_MODES),
    envvar="KVCAST_AGENT_INTENTS",
    help="Label a request without an intent by how its response ended (agent_tool_call, "
    "agent_stop, agent_length, agent_content_filter, agent_cut): tools: agents' requests "
    "(they offer tools or carry tool results); all: every response; off: none.",
)
@log_format_option
def tap_command(listen: str, upstream: str, source: str, hash_key_file: Path, block_size: int,
                include_text: bool, instance: str | None, max_connections: int,
                connect_timeout: float, first_byte_timeout: float, idle_timeout: float,
                max_body_bytes: int, max_event_bytes: int, identity_headers: tuple[str, ...],
                agent_intents: str, log_format: str) -> None:  # fmt: skip
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
                               instance=instance, agent_intents=agent_intents)  # fmt: skip
    except ValueError as exc:
        raise click.BadParameter(
            f"{hash_key_file}: {exc}", param_hint="'--hash-key-file'"
        ) from None
    names = tuple(n.strip() for value in identity_headers for n in value.split(",") if n.strip())
    limits = TapLimits(
        max_connections=max_connections,
        connect_timeout_s=connect_timeout or None,
        first_byte_timeout_s=first_byte_timeout or None,
        idle_timeout_s=idle_timeout or None,
        max_body_bytes=max_body_bytes,
        max_event_bytes=max_event_bytes,
        identity_headers=names,
    )
    LogConfig("info", log_format).configure()
    _raise_file_limit(2 * max_connections + 256)
    producer = KafkaEventProducer(bootstrap, topic, builder)
    tap = Tap(upstream, producer, limits=limits)
    try:
        run_tap(tap, host, port)
    finally:
        producer.close()
        dropped = sum(v for k, v in tap.counts.items() if k.startswith("events_dropped_"))
        click.echo(f"kvcast tap: {producer.sent} events sent, {producer.dropped} dropped by "
                   f"the producer, {dropped} by the tap", err=True)  # fmt: skip


def _raise_file_limit(wanted: int) -> None:
    """Raise the soft limit on open files towards ``wanted`` (each proxied request holds two
    sockets); warn when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < wanted:
            logging.getLogger(__name__).warning(
                "kvcast tap: open-file limit %d is below the %d that --max-connections "
                "needs; raise it (ulimit -n) or lower --max-connections",
                target,
                wanted,
            )
