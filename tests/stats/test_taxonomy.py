"""The default taxonomy: the IAC paper's categories and merges, plus the agent intents."""

from __future__ import annotations

import pytest

from kvcast.stats.events import parse_event
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.taxonomy import (
    AGENT_INTENTS,
    INTENTS_30,
    MERGE_10,
    MERGE_20,
    TAXONOMIES,
    UNKNOWN,
    intents,
    label_map,
)

AGENT = ("agent_tool_call", "agent_stop", "agent_length", "agent_content_filter", "agent_cut")


def test_the_agent_intents_are_named_once_and_described() -> None:
    assert tuple(AGENT_INTENTS) == AGENT
    assert all(description.endswith(".") for description in AGENT_INTENTS.values())


@pytest.mark.parametrize("size", [30, 20, 10])
def test_every_size_counts_the_agent_intents_as_states_of_their_own(size: int) -> None:
    labels = intents(size)
    assert labels == (*TAXONOMIES[size], *AGENT, UNKNOWN)
    mapping = label_map(size)
    assert all(mapping[label] == label for label in AGENT)
    labeller = IntentLabeller(label_map=mapping)
    for label in AGENT:
        event = parse_event({"session_id": "s", "turn": 1, "timestamp": 1.0,
                             "input_tokens": 1, "output_tokens": 1, "intent": label})  # fmt: skip
        assert labeller(event) == label
    assert labeller.folded == 0


def test_the_agent_intents_are_no_classifier_category_and_clash_with_none() -> None:
    """The classifier's heads are built on TAXONOMIES and the merges: agent intents stay out,
    so only a producer ever sets them."""
    categories = set(INTENTS_30) | set(MERGE_20) | set(MERGE_10)
    for merged in (*MERGE_20.values(), *MERGE_10.values()):
        categories |= set(merged)
    assert not categories & set(AGENT)
    assert not any(set(AGENT) & set(labels) for labels in TAXONOMIES.values())


def test_a_deployment_may_list_an_agent_intent_in_its_own_file() -> None:
    """A taxonomy file written before (or listing them again) keeps working."""
    mapping = label_map(10, ["agent_stop", "billing"])
    assert mapping["agent_stop"] == "agent_stop" and mapping["billing"] == "billing"
