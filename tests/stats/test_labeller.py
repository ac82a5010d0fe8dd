"""The intent of an event: the producer's label, then the classifier's, as the taxonomy has it."""

from __future__ import annotations

import orjson
import pytest

from kvcast.stats.events import Event, parse_event
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.taxonomy import INTENTS_30, label_map


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


def test_a_label_outside_the_taxonomy_folds_into_unknown_whatever_came_first() -> None:
    """No per-process state decides: 100 junk labels sent first (label squatting) fold, and
    every taxonomy label still counts as itself, in this process as in any other."""
    squatted = IntentLabeller()
    junk = [squatted(parse_event(event(intent=f"junk-{n}"))) for n in range(100)]
    assert junk == ["unknown"] * 100 and squatted.folded == 100
    fresh = IntentLabeller()
    for name in INTENTS_30:
        assert squatted(parse_event(event(intent=name))) == fresh(parse_event(event(intent=name)))
        assert fresh(parse_event(event(intent=name))) == name
    assert squatted.labels == fresh.labels == set(INTENTS_30)


def test_a_merged_taxonomy_and_a_deployments_own_intents_decide_the_states() -> None:
    labeller = IntentLabeller(label_map=label_map(10, ["billing"]))
    assert labeller(parse_event(event(intent="billing"))) == "billing"
    assert labeller(parse_event(event(intent="code_debugging"))) == label_map(10)["code_debugging"]
    assert labeller(parse_event(event(intent="travel"))) == "unknown"
    with pytest.raises(ValueError, match="use 1-64 of"):
        label_map(30, ["has space"])
    with pytest.raises(ValueError, match="already merged into"):
        label_map(10, ["code_debugging"])


def test_a_batch_is_labelled_as_its_events_one_by_one() -> None:
    names = ["chitchat", "junk", "billing", "translation", "code_debugging"]
    events = [parse_event(event(intent=names[n % 5], turn=1 + n)) for n in range(8)]
    events.insert(3, parse_event(event()))  # no intent: the classifier's answer
    labels = label_map(30, ["billing"])
    one_by_one = IntentLabeller(classify=lambda _: "translation", label_map=labels)
    batch = IntentLabeller(classify=lambda _: "translation", label_map=labels)
    assert batch.label_batch(events) == [one_by_one(e) for e in events]
    assert batch.labels == one_by_one.labels and batch.folded == one_by_one.folded > 0
