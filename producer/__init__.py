"""Producers of kvcast events from a serving stack's requests (docs/events.md).

Standard library and kafka-python only: import it into a router or a proxy.
"""

from kvcast.producer.builder import EventBuilder
from kvcast.producer.kafka import DROP_REASONS, KafkaEventProducer

__all__ = ["DROP_REASONS", "EventBuilder", "KafkaEventProducer"]
