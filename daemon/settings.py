"""All configuration of the daemon in one typed, frozen, validated place, each setting once.

Layering (highest wins): command-line flags, then ``KVCAST_*`` environment variables, then
the TOML config file (``--config`` / ``KVCAST_CONFIG``), then the defaults below. The
``kvcast run`` command builds one :class:`DaemonSettings`; nothing else reads the environment.

A field of :class:`DaemonSettings` declared with ``setting()`` carries its ``Setting``
(kvcast.stats.declarations):
the flag (``--commit-interval``), hence the variable (``KVCAST_COMMIT_INTERVAL``) and the config
key (``commit-interval``, or the field's name), its kind (bounds or choices), help and any
further rule. The CLI's options, the Helm chart's schema and the settings table of
docs/operating.md are generated from these, and ``__post_init__`` checks each value by the same
declaration, so a bound cannot differ between the flag and the Python API. Four fields take
their values from flags declared elsewhere, shared with other commands: ``stats``
(:class:`~kvcast.stats.config.StatsConfig`'s flags, cli/options.py, also ``replay`` and
``table``), ``tiers`` and ``tier_mode`` (also ``forecast`` and ``simulate``) and
``extra_intents`` (read from ``--taxonomy-file``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kvcast.producer.kafka import kafka_topic_of
from kvcast.stats.config import StatsConfig
from kvcast.stats.declarations import Choice, Number, Setting, Text, declared_settings, setting
from kvcast.stats.shadow import DEFAULT_SAMPLING
from kvcast.stats.store_url import SCHEMES, StoreURLError, parse, redact
from kvcast.stats.taxonomy import label_map
from kvcast.stats.tiers import DEFAULT_TIER_MODE, Tier, check_tiers

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
STORE_SCHEMES = SCHEMES  # the grammar's (kvcast.stats.store_url)
SOURCE_SCHEMES = ("kafka", "file")
MAX_WORKERS = 64


def declared() -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """Each declared field of :class:`DaemonSettings` with its setting, in field order."""
    return declared_settings(DaemonSettings)


def _source_problem(source: str) -> str | None:
    if urlsplit(source).scheme not in SOURCE_SCHEMES:
        return f"source {source!r}: expected kafka://HOST:PORT/TOPIC or file://PATH"
    parts = urlsplit(source)
    if parts.scheme == "kafka" and (not parts.netloc or not parts.path.strip("/")):
        return f"source {source!r}: expected kafka://HOST:PORT/TOPIC"
    return None


def _store_problem(store: str) -> str | None:
    try:
        parse(store)
    except StoreURLError as exc:  # names what is wrong, the password hidden
        return str(exc)
    return None


def _namespace_problem(namespace: str) -> str | None:
    if _NAMESPACE.match(namespace):
        return None
    return f"namespace {namespace!r}: use 1-64 of A-Z a-z 0-9 _ . -"


def _group_problem(group_id: str) -> str | None:
    return None if group_id else "group_id must not be empty"


def _address_problem(address: str) -> str | None:
    try:
        host_port(address)
    except ValueError as exc:
        return str(exc)
    return None


def _engine_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.netloc:
        return None
    return f"engine_metrics {url!r}: expected http://HOST:PORT/metrics"


_POSITIVE = Number(float, min=0, min_open=True)
_COUNT = Number(int, min=1)


@dataclass(frozen=True)
class DaemonSettings:
    """What ``kvcast run`` does. Times in seconds of wall time unless stated otherwise."""

    source: str | None = setting(
        None,  # embedded default
        "--source",
        Text(),
        "kafka://HOST:PORT/TOPIC or file://PATH; none: embedded default.",
        check=_source_problem,
    )
    store: str = setting(
        "memory://",
        "--store",
        Text(),
        "memory://, redis://[:PASSWORD@]HOST:PORT/DB, redis+cluster://HOST:PORT[,HOST:PORT...]"
        " or redis+sentinel://HOST:PORT[,...]/SERVICE (rediss... for TLS).",
        check=_store_problem,
    )
    # None: kvcast.NAMESPACE.TOPIC, so that deployments on different topics never share a group
    # (a member of a group gets no partition of a topic the group's leader does not subscribe to).
    group_id: str | None = setting(
        None,
        "--group-id",
        Text(),
        "Kafka consumer group (default: kvcast.NAMESPACE.TOPIC, one per deployment).",
        check=_group_problem,
    )
    namespace: str = setting(
        "kvcast", "--namespace", Text(), "Prefix of every Redis key.", check=_namespace_problem
    )
    # How the consumer group spreads partitions (see daemon/sources/kafka_source.py); every
    # member of a group must use the same.
    partition_assignment: str = setting(
        "cooperative-sticky",
        "--partition-assignment",
        Choice(("cooperative-sticky", "range")),
        "How the consumer group spreads partitions; cooperative-sticky moves only what must "
        "move when a replica joins or leaves. Every replica of a group must use the same.",
    )
    metrics_addr: str = setting(
        "127.0.0.1:9400",
        "--metrics-addr",
        Text(),
        "HOST:PORT of the HTTP server (/metrics, /v1/...).",
        check=_address_problem,
    )
    # Processes consuming for this instance (kafka:// source and a redis store when > 1): one
    # process decodes ~20,000 events/s in kafka-python; see daemon/workers.py.
    workers: int = setting(
        1,
        "--workers",
        Number(int, min=1, max=MAX_WORKERS),
        "Processes consuming for this instance (kafka:// and redis:// only); see README.",
    )
    capacity_blocks: int = setting(
        2275,
        "--capacity-blocks",
        _COUNT,
        "KV cache capacity of one instance, in blocks (default: the paper's 40 GB prefiller).",
    )
    # Cache tiers below the GPU tier (capacity_blocks), top first, blocks per instance, and how
    # they hold blocks: exclusive or inclusive (kvcast.stats.tiers; --tier, --tier-mode).
    tiers: tuple[Tier, ...] = ()
    tier_mode: str = DEFAULT_TIER_MODE
    instances: int = setting(
        1,
        "--instances",
        _COUNT,
        "Prefill instances behind session-affine routing; each sees lambda0/instances.",
    )
    kv_bytes_per_token: int | None = setting(
        None,
        "--kv-bytes-per-token",
        _COUNT,
        "KV cache bytes per token (capacities are then also reported in bytes).",
    )
    target_hit_ratios: tuple[float, ...] = setting(
        (0.5, 0.7),
        "--target-hit-ratio",
        Number(float, min=0, max=1, min_open=True, max_open=True),
        "Hit ratios to report the needed capacity for (repeatable; the variable takes them "
        "separated by spaces).",
        many=True,
    )
    commit_interval_s: float = setting(
        1.0, "--commit-interval", _POSITIVE, "Seconds between atomic state commits."
    )
    commit_max_events: int = setting(
        10_000,
        "--commit-max-events",
        _COUNT,
        "Commit after this many events even before the interval.",
    )
    max_uncommitted_events: int = setting(
        200_000,
        "--max-uncommitted-events",
        _COUNT,
        "Stop consuming while this many applied events await the store.",
    )
    refresh_interval_s: float = setting(
        5.0, "--refresh-interval", _POSITIVE, "Seconds between forecast recomputations."
    )
    table_interval_s: float = setting(
        10.0,
        "--table-interval",
        _POSITIVE,
        "Minimum seconds between table publications (only when it changed).",
    )
    status_interval_s: float = setting(
        5.0, "--status-interval", _POSITIVE, "Seconds between status lines."
    )
    shutdown_timeout_s: float = setting(
        10.0, "--shutdown-timeout", _POSITIVE, "Seconds SIGTERM may spend storing what was applied."
    )
    max_backoff_s: float = setting(
        30.0,
        "--max-backoff",
        _POSITIVE,
        "Longest wait (s) between retries while the store is unreachable.",
    )
    classifier: str = setting(
        "auto",
        "--classifier",
        Choice(("off", "auto", "on")),
        "Classify events without an intent: auto = when installed (never for the embedded"
        " default, whose events carry intents).",
    )
    classifier_budget_s: float = setting(  # per consumer poll; unanswered events are `unknown`
        0.05,
        "--classifier-budget",
        _POSITIVE,
        "Seconds a poll's events may wait for the classifier; the rest count as unknown.",
    )
    classifier_backbone: str | None = setting(  # None: the default backbone
        None, "--classifier-backbone", Text(), "Embedding model: local path or name."
    )
    classifier_head: str | None = setting(  # None: the shipped head or zero-shot
        None, "--classifier-head", Text(), "Trained head file (default: shipped)."
    )
    taxonomy: int = setting(  # the IAC paper's merges
        30,
        "--taxonomy",
        Choice((30, 20, 10)),
        "Intent categories (30, or the IAC paper's 20 or 10 merges).",
    )
    # Intents a deployment counts as states of their own (--taxonomy-file, read by the CLI);
    # any other producer intent outside the taxonomy counts as unknown.
    extra_intents: tuple[str, ...] = ()
    speedup: float = setting(
        240.0,
        "--speedup",
        _POSITIVE,
        "Embedded default: event-time seconds replayed per wall second.",
    )
    sample_conversations: int = setting(
        20_000,
        "--sample-conversations",
        _COUNT,
        "Embedded default: conversations in the generated workload.",
    )
    # Kafka connection security, passed to kafka-python as is (None: its defaults, PLAINTEXT).
    kafka_security_protocol: str | None = setting(
        None,
        "--kafka-security-protocol",
        Choice(("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
        "Kafka connection security (kafka-python's security_protocol).",
    )
    kafka_sasl_mechanism: str | None = setting(
        None,
        "--kafka-sasl-mechanism",
        Choice(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
        "Kafka SASL mechanism.",
    )
    kafka_sasl_username: str | None = setting(
        None, "--kafka-sasl-username", Text(), "Kafka SASL user."
    )
    kafka_sasl_password: str | None = setting(
        None,
        "--kafka-sasl-password",
        Text(),
        "Kafka SASL password; set it in the environment variable rather than on the command line.",
    )
    kafka_ssl_cafile: str | None = setting(
        None, "--kafka-ssl-cafile", Text(), "CA certificate file for Kafka TLS."
    )
    kafka_ssl_certfile: str | None = setting(
        None, "--kafka-ssl-certfile", Text(), "Client certificate file for Kafka TLS."
    )
    kafka_ssl_keyfile: str | None = setting(
        None, "--kafka-ssl-keyfile", Text(), "Client key file for Kafka TLS."
    )
    # Engines' Prometheus endpoints (http://HOST:PORT/metrics), scraped every interval.
    engine_metrics: tuple[str, ...] = setting(
        (),
        "--engine-metrics",
        Text(),
        "Engines' Prometheus endpoints, comma-separated (http://HOST:PORT/metrics): their hit "
        "ratio is exported beside the forecast, and vLLM's capacity and block size are taken when "
        "--capacity-blocks and --block-size are not given.",
        separator=",",
        check=_engine_problem,
    )
    engine_scrape_interval_s: float = setting(
        15.0,
        "--engine-scrape-interval",
        _POSITIVE,
        "Seconds between scrapes of the --engine-metrics endpoints.",
    )
    # Rejected records' bytes to this Kafka topic (same brokers as the source), or to
    # kafka://HOST:PORT/TOPIC; None: none.
    dead_letter_topic: str | None = setting(
        None,
        "--dead-letter-topic",
        Text(),
        "Kafka topic for rejected records as they arrived (the source's brokers), or "
        "kafka://HOST:PORT/TOPIC; committed with their partition.",
    )
    # Fraction of KV blocks the shadow LRU simulation keeps (kvcast.stats.shadow); 0: off.
    shadow_sampling: float = setting(
        DEFAULT_SAMPLING,
        "--shadow-sampling",
        Number(float, min=0, max=1),
        "Fraction of KV blocks the shadow LRU simulation keeps (its measured hit-ratio curve"
        " beside the forecast); 0 turns it off.",
    )
    stats: StatsConfig = field(default_factory=StatsConfig)

    def __post_init__(self) -> None:
        if self.group_id is None:
            object.__setattr__(self, "group_id", default_group_id(self.namespace, self.source))
        problems: list[str] = []
        refused: set[str] = set()  # the rules between settings read only values that passed
        for declaration, declared_setting in declared():
            value = getattr(self, declaration.name)
            optional = declaration.default is None
            found = list(declared_setting.problems(declaration.name, value, optional))
            if found:
                refused.add(declaration.name)
                problems.extend(found)
        # The rules between settings, which no single declaration can state.
        if (
            "workers" not in refused
            and self.workers > 1
            and not ((self.source or "").startswith("kafka://") and self.store.startswith("redis"))
        ):
            # Workers share partitions through the consumer group and state through Redis.
            problems.append(
                f"workers {self.workers} needs a kafka:// source and a redis:// store"
                f" (got source {self.source or 'embedded default'},"
                f" store {urlsplit(self.store).scheme}://)"
            )
        if not {"max_uncommitted_events", "commit_max_events"} & refused and (
            self.max_uncommitted_events < self.commit_max_events
        ):
            problems.append("max_uncommitted_events must be >= commit_max_events")
        if self.dead_letter_topic is not None:
            try:
                self.dead_letter_target()
            except ValueError as exc:
                problems.append(str(exc))
        if "taxonomy" not in refused:
            try:
                label_map(self.taxonomy, self.extra_intents)
            except ValueError as exc:
                problems.append(str(exc))
        if "capacity_blocks" not in refused:
            try:
                check_tiers(self.capacity_blocks, self.tiers, self.tier_mode)
            except ValueError as exc:
                problems.append(f"tiers: {exc}")
        if problems:
            raise ValueError("; ".join(problems))

    def http_host_port(self) -> tuple[str, int]:
        """``metrics_addr`` as (host, port); ValueError naming the problem."""
        return host_port(self.metrics_addr)

    @property
    def embedded(self) -> bool:
        return self.source is None

    def label_map(self) -> dict[str, str]:
        """Producer label -> state label: the taxonomy and the extra intents."""
        return label_map(self.taxonomy, self.extra_intents)

    def dead_letter_target(self) -> tuple[str, str]:
        """``(bootstrap servers, topic)`` of ``dead_letter_topic``; ValueError naming it."""
        value = self.dead_letter_topic or ""
        if value.startswith("kafka://"):
            try:
                return kafka_topic_of(value)
            except ValueError as exc:
                raise ValueError(f"dead_letter_topic: {exc}") from None
        if not (self.source or "").startswith("kafka://"):
            raise ValueError(
                f"dead_letter_topic {value!r}: a topic name needs a kafka:// source (its "
                "brokers); give kafka://HOST:PORT/TOPIC otherwise"
            )
        bootstrap, _topic = kafka_topic_of(self.source or "")
        try:
            return kafka_topic_of(f"kafka://{bootstrap}/{value}")
        except ValueError as exc:
            raise ValueError(f"dead_letter_topic: {exc}") from None

    def kafka_options(self) -> dict[str, str]:
        """kafka-python consumer options for the connection's security (only those set)."""
        options = {
            "security_protocol": self.kafka_security_protocol,
            "sasl_mechanism": self.kafka_sasl_mechanism,
            "sasl_plain_username": self.kafka_sasl_username,
            "sasl_plain_password": self.kafka_sasl_password,
            "ssl_cafile": self.kafka_ssl_cafile,
            "ssl_certfile": self.kafka_ssl_certfile,
            "ssl_keyfile": self.kafka_ssl_keyfile,
        }
        return {name: value for name, value in options.items() if value is not None}


def redact_url(url: str) -> str:
    """``url`` with every secret (the user info's password, any secret-named option in any
    spelling) replaced by ``***``; never raises (:func:`kvcast.stats.store_url.redact`)."""
    return redact(url)


def default_group_id(namespace: str, source: str | None) -> str:
    """``kvcast.NAMESPACE.TOPIC`` for a Kafka source, ``kvcast.NAMESPACE`` otherwise.

    The instances of one deployment share a namespace and a topic, hence a group; two
    deployments differ in one or the other, hence never share a group.
    """
    topic = urlsplit(source).path.strip("/") if source and source.startswith("kafka://") else ""
    return f"kvcast.{namespace}.{topic}" if topic else f"kvcast.{namespace}"


def host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (an empty host: every interface) as (host, port); ValueError naming it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics_addr {address!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)
