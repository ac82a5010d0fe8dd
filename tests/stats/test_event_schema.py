"""The event JSON Schema says what ``parse_event`` decides, and the shipped file is current."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcast.stats.event_schema import event_json_schema, render_event_schema
from kvcast.stats.events import EventRejected, parse_event

SHIPPED = Path(__file__).resolve().parents[2] / "docs" / "event.schema.json"

VALIDATOR = jsonschema.Draft202012Validator(event_json_schema())
BASE = {"session_id": "s-1", "turn": 2, "timestamp": 1_700_000_000.5, "input_tokens": 300,
        "output_tokens": 20}  # fmt: skip
FIELDS = [*BASE, "schema", "request_id", "intent", "cached_tokens", "prompt", "messages", "type",
          "instance", "block_hashes", "unknown_extra"]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 66), 1 << 66),
    st.sampled_from([0, 1, 2, -1, 300, 301, 10**6, 10**6 + 1, 10**9, 10**9 + 1, 2**63, 2**64]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.sampled_from(["", "x" * 128, "x" * 129, "x" * 256, "x" * 257, "x" * 512, "x" * 513]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["role", "content", "name"]), inner, max_size=3),
    ),
    max_leaves=6,
)
changes = st.dictionaries(
    st.sampled_from(FIELDS), st.one_of(values, st.just("<delete>")), max_size=3
)


def accepted(text: str) -> bool:
    try:
        parse_event(text.encode())
    except EventRejected:
        return False
    return True


INTEGER_FIELDS = ("turn", "input_tokens", "output_tokens", "cached_tokens")


def schema_says_valid(document: dict) -> bool:
    """The schema, and the rules of its x-kvcast-rules."""
    if not VALIDATOR.is_valid(document):
        return False
    if any(isinstance(document.get(field), float) for field in INTEGER_FIELDS):
        return False  # 300.0: an integer to JSON Schema, not to the contract
    if any(isinstance(block, float) for block in document.get("block_hashes") or []):
        return False
    cached, inputs = document.get("cached_tokens"), document["input_tokens"]
    return cached is None or cached <= inputs


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(changes)
def test_the_schema_accepts_exactly_what_parse_event_accepts(edits: dict) -> None:
    document = dict(BASE)
    for field, value in edits.items():
        if value == "<delete>":
            document.pop(field, None)
        else:
            document[field] = value
    text = json.dumps(document)  # big integers stay integers, as a producer writes them
    assert schema_says_valid(json.loads(text)) == accepted(text), text


def test_a_full_example_event_is_valid_and_accepted() -> None:
    example = {**BASE, "schema": 1, "request_id": "r-9", "intent": "code_debugging",
               "cached_tokens": 256, "instance": "vllm-0", "block_hashes": [17, "ab12", 2**64 - 1],
               "messages": [{"role": "user", "content": "hi", "name": "a"}]}  # fmt: skip
    assert VALIDATOR.is_valid(example) and accepted(json.dumps(example))


def test_the_shipped_schema_file_is_the_generated_one() -> None:
    assert SHIPPED.read_text() == render_event_schema(), (
        "docs/event.schema.json is out of date: run .venv/bin/python scripts/event_schema.py"
    )


BAD = [
    ({"session_id": None}, "missing_field"),
    ({"turn": 0}, "out_of_range"),
    ({"cached_tokens": 301}, "cached_exceeds_input"),
    ({"schema": 2}, "unsupported_schema"),
    ({"intent": "x" * 129}, "out_of_range"),
    ({"block_hashes": [2**64]}, "wrong_type"),
    ({"input_tokens": 300.0}, "wrong_type"),
    ({"messages": [{"role": "user"}]}, "wrong_type"),
]


@pytest.mark.parametrize(("edit", "reason"), BAD)
def test_what_the_contract_rejects_the_schema_rejects(edit: dict, reason: str) -> None:
    document = {**BASE, **edit}
    text = json.dumps(document)
    with pytest.raises(EventRejected) as rejected:
        parse_event(text.encode())
    assert rejected.value.reason == reason
    assert not schema_says_valid(json.loads(text))
