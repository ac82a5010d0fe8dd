"""All configuration of the daemon in one typed, frozen, validated place.

Layering (highest wins): command-line flags, then ``KVCAST_*`` environment variables, then
the TOML config file (``--config`` / ``KVCAST_CONFIG``), then the defaults below. The
``kvcast run`` command builds one :class:`DaemonSettings`; nothing else reads the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kvcast.producer.kafka import kafka_topic_of
from kvcast.stats.config import StatsConfig
from kvcast.stats.shadow import DEFAULT_SAMPLING
from kvcast.stats.store_url import SCHEMES, StoreURLError, parse, redact
from kvcast.stats.taxonomy import label_map
from kvcast.stats.tiers import DEFAULT_TIER_MODE, Tier, check_tiers

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
STORE_SCHEMES = SCHEMES  # the grammar's (kvcast.stats.store_url)
SOURCE_SCHEMES = ("kafka", "file")
MAX_WORKERS = 64


@dataclass(frozen=True)
class DaemonSettings:
    """What ``kvcast run`` does. Times in seconds of wall time unless stated otherwise."""

    source: str | None = None  # kafka://HOST:PORT[,HOST:PORT]/TOPIC, file://PATH; None: embedded
    store: str = "memory://"
    # None: kvcast.NAMESPACE.TOPIC, so that deployments on different topics never share a group
    # (a member of a group gets no partition of a topic the group's leader does not subscribe to).
    group_id: str | None = None
    # How the consumer group spreads partitions: cooperative-sticky or range (see
    # daemon/sources/kafka_source.py); every member of a group must use the same.
    partition_assignment: str = "cooperative-sticky"
    namespace: str = "kvcast"
    metrics_addr: str = "127.0.0.1:9400"
    # Processes consuming for this instance (kafka:// source and a redis store when > 1): one
    # process decodes ~20,000 events/s in kafka-python; see daemon/workers.py.
    workers: int = 1
    capacity_blocks: int = 2275
    # Cache tiers below the GPU tier (capacity_blocks), top first, blocks per instance, and how
    # they hold blocks: exclusive or inclusive (kvcast.stats.tiers; --tier, --tier-mode).
    tiers: tuple[Tier, ...] = ()
    tier_mode: str = DEFAULT_TIER_MODE
    instances: int = 1
    kv_bytes_per_token: int | None = None
    target_hit_ratios: tuple[float, ...] = (0.5, 0.7)
    commit_interval_s: float = 1.0
    commit_max_events: int = 10_000
    max_uncommitted_events: int = 200_000
    refresh_interval_s: float = 5.0
    table_interval_s: float = 10.0
    status_interval_s: float = 5.0
    shutdown_timeout_s: float = 10.0
    max_backoff_s: float = 30.0
    classifier: str = "auto"  # off | auto (when installed; not for the embedded default) | on
    classifier_budget_s: float = 0.05  # per consumer poll; unanswered events are `unknown`
    classifier_backbone: str | None = None  # a local path or cached model name; None: default
    classifier_head: str | None = None  # a head file; None: the shipped head or zero-shot
    taxonomy: int = 30  # 30, 20 or 10 intent categories (the IAC paper's merges)
    # Intents a deployment counts as states of their own (--taxonomy-file, read by the CLI);
    # any other producer intent outside the taxonomy counts as unknown.
    extra_intents: tuple[str, ...] = ()
    speedup: float = 240.0  # embedded default: event seconds per wall second
    sample_conversations: int = 20_000  # embedded default: size of the generated workload
    # Kafka connection security, passed to kafka-python as is (None: its defaults, PLAINTEXT).
    kafka_security_protocol: str | None = None  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    kafka_sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None  # a secret: prefer KVCAST_KAFKA_SASL_PASSWORD
    kafka_ssl_cafile: str | None = None
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    # Engines' Prometheus endpoints (http://HOST:PORT/metrics), scraped every interval.
    engine_metrics: tuple[str, ...] = ()
    engine_scrape_interval_s: float = 15.0
    # Rejected records' bytes to this Kafka topic (same brokers as the source), or to
    # kafka://HOST:PORT/TOPIC; None: none.
    dead_letter_topic: str | None = None
    # Fraction of KV blocks the shadow LRU simulation keeps (kvcast.stats.shadow); 0: off.
    shadow_sampling: float = DEFAULT_SAMPLING
    stats: StatsConfig = field(default_factory=StatsConfig)

    def __post_init__(self) -> None:
        if self.group_id is None:
            object.__setattr__(self, "group_id", default_group_id(self.namespace, self.source))
        problems: list[str] = []
        if self.source is not None and urlsplit(self.source).scheme not in SOURCE_SCHEMES:
            problems.append(
                f"source {self.source!r}: expected kafka://HOST:PORT/TOPIC or file://PATH"
            )
        if self.source is not None and self.source.startswith("kafka://"):
            parts = urlsplit(self.source)
            if not parts.netloc or not parts.path.strip("/"):
                problems.append(f"source {self.source!r}: expected kafka://HOST:PORT/TOPIC")
        try:
            parse(self.store)
        except StoreURLError as exc:  # names what is wrong, the password hidden
            problems.append(str(exc))
        if not _NAMESPACE.match(self.namespace):
            problems.append(f"namespace {self.namespace!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        if not self.group_id:
            problems.append("group_id must not be empty")
        if self.partition_assignment not in ("cooperative-sticky", "range"):
            problems.append(
                f"partition_assignment {self.partition_assignment!r}: expected "
                "cooperative-sticky or range"
            )
        try:
            self.http_host_port()
        except ValueError as exc:
            problems.append(str(exc))
        if not 1 <= self.workers <= MAX_WORKERS:
            problems.append(f"workers must be within 1..{MAX_WORKERS}, got {self.workers}")
        elif self.workers > 1 and not (
            (self.source or "").startswith("kafka://") and self.store.startswith("redis")
        ):
            # Workers share partitions through the consumer group and state through Redis.
            problems.append(
                f"workers {self.workers} needs a kafka:// source and a redis:// store"
                f" (got source {self.source or 'embedded default'},"
                f" store {urlsplit(self.store).scheme}://)"
            )
        for name in ("capacity_blocks", "instances", "commit_max_events", "sample_conversations"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_uncommitted_events < self.commit_max_events:
            problems.append("max_uncommitted_events must be >= commit_max_events")
        for name in (
            "commit_interval_s",
            "refresh_interval_s",
            "table_interval_s",
            "status_interval_s",
            "shutdown_timeout_s",
            "max_backoff_s",
            "speedup",
            "engine_scrape_interval_s",
        ):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if self.dead_letter_topic is not None:
            try:
                self.dead_letter_target()
            except ValueError as exc:
                problems.append(str(exc))
        for url in self.engine_metrics:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                problems.append(f"engine_metrics {url!r}: expected http://HOST:PORT/metrics")
        if self.classifier not in ("off", "auto", "on"):
            problems.append(f"classifier {self.classifier!r}: expected off, auto or on")
        if not 0 <= self.shadow_sampling <= 1:
            problems.append(f"shadow_sampling must be within 0..1, got {self.shadow_sampling}")
        if not self.classifier_budget_s > 0:
            problems.append(f"classifier_budget_s must be > 0, got {self.classifier_budget_s}")
        protocols = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
        if self.kafka_security_protocol not in (None, *protocols):
            problems.append(
                f"kafka_security_protocol {self.kafka_security_protocol!r}: expected one of "
                + ", ".join(protocols)
            )
        mechanisms = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
        if self.kafka_sasl_mechanism not in (None, *mechanisms):
            problems.append(
                f"kafka_sasl_mechanism {self.kafka_sasl_mechanism!r}: expected one of "
                + ", ".join(mechanisms)
            )
        if self.taxonomy not in (30, 20, 10):
            problems.append(f"taxonomy must be 30, 20 or 10 categories, got {self.taxonomy}")
        else:
            try:
                label_map(self.taxonomy, self.extra_intents)
            except ValueError as exc:
                problems.append(str(exc))
        try:
            check_tiers(self.capacity_blocks, self.tiers, self.tier_mode)
        except ValueError as exc:
            problems.append(f"tiers: {exc}")
        for target in self.target_hit_ratios:
            if not 0 < target < 1:
                problems.append(f"target hit ratio {target} must be within (0, 1)")
        if problems:
            raise ValueError("; ".join(problems))

    def http_host_port(self) -> tuple[str, int]:
        """``metrics_addr`` as (host, port); ValueError naming the problem."""
        host, sep, port = self.metrics_addr.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"metrics_addr {self.metrics_addr!r}: expected HOST:PORT")
        return host.strip("[]") or "0.0.0.0", int(port)

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
