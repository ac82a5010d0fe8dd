"""One process's parts wired together: store, source, classifier, publisher and the loop.

``kvcast run`` builds one for its own process, and ``daemon/workers.py`` one in each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TextIO

from kvcast.daemon.classification import open_classifier
from kvcast.daemon.pipeline import IntentLabeller
from kvcast.daemon.publisher import Publisher
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import embedded_source, open_source
from kvcast.daemon.stores import open_store
from kvcast.daemon.stores.instrumented import InstrumentedStore


@dataclass
class Instance:
    """The loop of one process and what it owns; :meth:`close` after ``daemon.run()``."""

    daemon: Daemon
    publisher: Publisher
    store: InstrumentedStore
    classifier: Any | None

    def close(self) -> None:
        self.store.close()
        if self.classifier is not None:
            self.classifier.close()


def open_store_and_source(settings: DaemonSettings) -> tuple[Any, Any]:
    """The state store and event source the settings name; ValueError says what is wrong."""
    store = open_store(settings.store, settings.namespace)
    source = (
        embedded_source(
            settings.sample_conversations,
            settings.speedup,
            settings.capacity_blocks,
            settings.stats.block_size,
        )
        if settings.embedded
        else open_source(settings.source or "", settings.group_id, **settings.kafka_options())
    )
    return store, source


def build_instance(
    settings: DaemonSettings,
    store: Any,
    source: Any,
    *,
    status_out: TextIO | None,
    publishing: bool = True,
) -> Instance:
    """Wire a process's loop; RuntimeError when ``--classifier on`` cannot be honoured."""
    mode = "off" if settings.embedded and settings.classifier == "auto" else settings.classifier
    classifier = open_classifier(
        mode,
        settings.classifier_budget_s,
        settings.classifier_backbone,
        settings.classifier_head,
        settings.taxonomy,
    )
    instrumented = InstrumentedStore(store)
    reports = [instrumented.metrics] + ([classifier.metrics] if classifier else [])
    publisher = Publisher(
        settings, instrumented, source.health, extra_metrics=reports, publishing=publishing
    )
    labeller = IntentLabeller(classify_batch=classifier.classify_batch if classifier else None)
    daemon = Daemon(
        settings, instrumented, source, publisher, labeller=labeller, status_out=status_out
    )
    return Instance(daemon, publisher, instrumented, classifier)
