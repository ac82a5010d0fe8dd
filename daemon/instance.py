"""One process's parts wired together: store, source, classifier, publisher and the loop.

``kvcast run`` builds one for its own process, and ``daemon/workers.py`` one in each worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from kvcast.daemon.classification import open_classifier
from kvcast.daemon.engine_metrics import EngineScraper
from kvcast.daemon.publisher import Publisher
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import EventSource, open_source
from kvcast.daemon.stores import open_store
from kvcast.daemon.stores.instrumented import InstrumentedStore
from kvcast.exporters.dead_letter import DeadLetterSink
from kvcast.stats.labeller import IntentLabeller


@dataclass
class Instance:
    """The loop of one process and what it owns; :meth:`close` after ``daemon.run()``."""

    daemon: Daemon
    publisher: Publisher
    store: InstrumentedStore
    classifier: Any | None
    engine_scraper: EngineScraper | None = None

    def close(self) -> None:
        if self.engine_scraper is not None:
            self.engine_scraper.close()
        self.store.close()
        if self.classifier is not None:
            self.classifier.close()


def open_store_and_source(
    settings: DaemonSettings, demo_source: Callable[[DaemonSettings], EventSource] | None = None
) -> tuple[Any, Any]:
    """The state store and event source the settings name; ValueError says what is wrong.

    ``demo_source`` builds the embedded default's source (the CLI passes the sample workload);
    without it, settings that name no source are an error.
    """
    store = open_store(settings.store, settings.namespace)
    try:
        if settings.embedded:
            if demo_source is None:
                raise ValueError("no --source given and no embedded sample workload available")
            return store, demo_source(settings)
        kafka = settings.kafka_options()
        source = open_source(
            settings.source or "", settings.group_id, settings.partition_assignment, **kafka
        )
        return store, source
    except Exception:
        store.close()  # no connection left behind by a source that could not be opened
        raise


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
    scraper = None
    if settings.engine_metrics and publishing:  # the primary alone exports the engines' figures
        scraper = EngineScraper(settings.engine_metrics, settings.engine_scrape_interval_s).start()
        reports.append(scraper.metrics)
    publisher = Publisher(
        settings, instrumented, source.health, extra_metrics=reports, publishing=publishing
    )
    labeller = IntentLabeller(
        classify_batch=classifier.classify_batch if classifier else None,
        label_map=settings.label_map(),
    )
    dead_letter = None
    if settings.dead_letter_topic is not None:
        bootstrap, topic = settings.dead_letter_target()
        dead_letter = DeadLetterSink(bootstrap, topic, kafka_options=settings.kafka_options())
    daemon = Daemon(
        settings,
        instrumented,
        source,
        publisher,
        labeller=labeller,
        status_out=status_out,
        dead_letter=dead_letter,
    )
    return Instance(daemon, publisher, instrumented, classifier, scraper)
