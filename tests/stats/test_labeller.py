"""The intent of an event: the producer's label, then the classifier's, bounded in number."""

from __future__ import annotations

import orjson

from kvcast.stats.events import Event, parse_event
from kvcast.stats.labeller import IntentLabeller


def event(**fields: object) -> bytes:
    base = {"session_id": "s", "turn": 1, "timestamp": 10.0, "input_tokens": 40, "output_tokens": 2}
    return orjson.dumps({**base, **fields})


def test_labeller_prefers_the_producer_label_then_the_classifier() -> None:
    seen: list[Event] = []

    def classify(e: Event) -> str:
        seen.append(e)
        return "translation"

    labeller = IntentLabeller(classify=classify)
    assert labeller(parse_event(event(intent="chitchat"))) == "chitchat"
    assert labeller(parse_event(event())) == "translation"
    assert len(seen) == 1
    assert IntentLabeller()(parse_event(event())) == "unknown"


def test_labels_beyond_the_cap_fold_into_unknown() -> None:
    labeller = IntentLabeller(max_labels=2)
    labels = [labeller(parse_event(event(intent=f"i{n}"))) for n in range(4)]
    assert labels == ["i0", "i1", "unknown", "unknown"]
    assert labeller.folded == 2
    assert labeller(parse_event(event(intent="i1"))) == "i1"


def test_a_batch_is_labelled_as_its_events_one_by_one() -> None:
    events = [parse_event(event(intent=f"i{n % 5}", turn=1 + n)) for n in range(8)]
    events.insert(3, parse_event(event()))  # no intent: the classifier's answer
    one_by_one = IntentLabeller(classify=lambda _: "translation", max_labels=3)
    batch = IntentLabeller(classify=lambda _: "translation", max_labels=3)
    assert batch.label_batch(events) == [one_by_one(e) for e in events]
    assert batch.labels == one_by_one.labels and batch.folded == one_by_one.folded > 0
