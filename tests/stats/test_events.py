"""The event contract (SPEC section 2): valid events parse, every broken one names its reason."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.stats.events import (
    MAX_EVENT_BYTES,
    REJECT_REASONS,
    EventRejected,
    parse_event,
)
from tests.support import VALID


def rejected(raw: object) -> EventRejected:
    with pytest.raises(EventRejected) as info:
        parse_event(raw)  # type: ignore[arg-type]
    return info.value


def test_minimal_event_parses_with_defaults() -> None:
    event = parse_event(orjson.dumps(VALID))
    assert (event.session_id, event.turn, event.timestamp) == ("s-1", 2, 1700000000.25)
    assert (event.input_tokens, event.output_tokens) == (300, 40)
    assert event.request_id == parse_event(dict(VALID)).request_id
    assert event.intent is None and event.cached_tokens is None


def test_default_request_id_distinguishes_sessions_and_turns() -> None:
    a = parse_event({**VALID, "session_id": "a1", "turn": 1})
    b = parse_event({**VALID, "session_id": "a", "turn": 11})
    assert a.request_id != b.request_id


def test_optional_fields_and_unknown_fields() -> None:
    event = parse_event(
        {
            **VALID,
            "request_id": "r-9",
            "intent": "code_generation",
            "cached_tokens": 300,
            "prompt": "hello",
            "messages": [{"role": "user", "content": "hi"}],
            "type": "text",
            "instance": "prefill-0",
            "block_hashes": [1, "a2"],
            "schema": 1,
            "something_new": {"x": 1},
        }
    )
    assert event.request_id == "r-9" and event.cached_tokens == 300
    assert event.block_hashes == [1, "a2"]


@pytest.mark.parametrize(
    ("change", "reason", "field"),
    [
        ({"session_id": None}, "missing_field", "session_id"),
        ({"turn": None}, "missing_field", "turn"),
        ({"timestamp": None}, "missing_field", "timestamp"),
        ({"input_tokens": None}, "missing_field", "input_tokens"),
        ({"output_tokens": None}, "missing_field", "output_tokens"),
        ({"session_id": 7}, "wrong_type", "session_id"),
        ({"session_id": ""}, "out_of_range", "session_id"),
        ({"session_id": "x" * 257}, "out_of_range", "session_id"),
        ({"turn": 0}, "out_of_range", "turn"),
        ({"turn": 1.0}, "wrong_type", "turn"),
        ({"turn": True}, "wrong_type", "turn"),
        ({"input_tokens": -1}, "out_of_range", "input_tokens"),
        ({"output_tokens": "5"}, "wrong_type", "output_tokens"),
        ({"timestamp": "now"}, "wrong_type", "timestamp"),
        ({"timestamp": -5}, "out_of_range", "timestamp"),
        ({"timestamp": math.inf}, "non_finite", "timestamp"),
        ({"timestamp": math.nan}, "non_finite", "timestamp"),
        ({"input_tokens": math.nan}, "non_finite", "input_tokens"),
        ({"cached_tokens": 301}, "cached_exceeds_input", "cached_tokens"),
        ({"cached_tokens": -1}, "out_of_range", "cached_tokens"),
        ({"request_id": 5}, "wrong_type", "request_id"),
        ({"prompt": ["x"]}, "wrong_type", "prompt"),
        ({"messages": "hi"}, "wrong_type", "messages"),
        ({"messages": [{"role": "user"}]}, "wrong_type", "messages[0]"),
        ({"block_hashes": [1.5]}, "wrong_type", "block_hashes[0]"),
        ({"schema": 2}, "unsupported_schema", "schema"),
        ({"schema": 1.0}, "unsupported_schema", "schema"),  # the contract's version is an int
        ({"schema": "1"}, "unsupported_schema", "schema"),
    ],
)
def test_each_broken_field_is_named(change: dict[str, object], reason: str, field: str) -> None:
    raw = {k: v for k, v in {**VALID, **change}.items() if v is not None}
    error = rejected(raw)
    assert error.reason == reason
    assert f"'{field}'" in error.detail


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b'"text"', "not_an_object"),
        (b"null", "not_an_object"),
        (b"NaN", "invalid_json"),
    ],
)
def test_undecodable_payloads(raw: bytes, reason: str) -> None:
    assert rejected(raw).reason == reason


def test_huge_integers_are_out_of_range() -> None:
    raw = orjson.dumps(VALID)[:-1] + b', "input_tokens": ' + b"9" * 40 + b"}"
    error = rejected(raw)
    # orjson decodes integers beyond 64 bits as floats, so the field is not an integer.
    assert error.reason in ("out_of_range", "wrong_type")
    assert "'input_tokens'" in error.detail


def test_oversized_payload_rejected_before_decoding() -> None:
    raw = orjson.dumps({**VALID, "prompt": "x" * MAX_EVENT_BYTES})
    assert rejected(raw).reason == "oversized"


def test_rejection_detail_never_echoes_user_text() -> None:
    secret = "my password is hunter2"
    error = rejected({**VALID, "session_id": ["nope"], "prompt": secret})
    assert secret not in str(error) and "hunter2" not in error.detail


@given(
    field=st.sampled_from([*VALID, "schema", "request_id", "intent", "cached_tokens", "type"]),
    shape=st.sampled_from(["bare", "list", "object", "long"]),
)
def test_no_field_of_any_shape_echoes_its_value_in_a_rejection(field: str, shape: str) -> None:
    # Found by the atheris harness: `schema` once quoted its value. Every field, every shape.
    secret = "SECRET-7f3a"
    value = {"bare": secret, "list": [secret], "object": {secret: secret}, "long": secret * 500}
    try:
        parse_event(orjson.dumps({**VALID, field: value[shape]}))
    except EventRejected as error:
        assert secret not in str(error) and len(str(error)) < 300


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    [
        "session_id",
        "turn",
        "timestamp",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        "request_id",
        "prompt",
        "messages",
        "intent",
        "type",
        "instance",
        "block_hashes",
        "schema",
        "other",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(raw: bytes) -> None:
    try:
        parse_event(raw)
    except EventRejected as error:
        assert error.reason in REJECT_REASONS and error.detail


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(field_names, json_values, max_size=10))
def test_arbitrary_objects_either_parse_or_name_a_reason(obj: dict[str, object]) -> None:
    try:
        event = parse_event(obj)
    except EventRejected as error:
        assert error.reason in REJECT_REASONS
        assert error.detail
    else:
        assert isinstance(event.session_id, str) and event.turn >= 1
        assert math.isfinite(event.timestamp) and event.input_tokens >= 0


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(["session_id", "turn", "timestamp", "input_tokens", "output_tokens"]),
    value=json_values,
)
def test_corrupting_one_required_field_is_caught_and_named(field: str, value: object) -> None:
    raw = {**VALID, field: value}
    try:
        parse_event(orjson.dumps(raw))
    except EventRejected as error:
        assert error.reason in REJECT_REASONS
        if error.reason not in ("invalid_json", "oversized"):
            assert f"'{field}'" in error.detail
    except TypeError:  # orjson cannot encode it: not a reachable payload
        pass


@settings(max_examples=500, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "session_id": st.text(max_size=3) | st.integers(),
            "turn": st.integers(-1, 3) | st.floats() | st.booleans(),
            "timestamp": st.floats() | st.integers(-2, 2**60),
            "input_tokens": st.integers(-1, 5),
            "output_tokens": st.integers(-1, 5) | st.none(),
        },
        optional={
            "cached_tokens": st.integers(-1, 6) | st.booleans(),
            "request_id": st.text(max_size=2),
            "intent": st.text(max_size=2) | st.integers(),
            "prompt": st.text(max_size=2) | st.integers(),
            "schema": st.sampled_from([1, 1.0, True, 2]),
            # fields outside the contract (ignored) and those only the detailed path checks
            "model": st.none() | st.integers() | st.text(max_size=2) | st.lists(st.integers()),
            "latency_ms": st.floats() | st.integers(),
            "type": st.text(max_size=2) | st.integers(),
            "block_hashes": st.lists(st.integers() | st.booleans(), max_size=2),
        },
    )
)
def test_fast_path_agrees_with_the_detailed_validator(obj: dict[str, object]) -> None:
    from kvcast.stats.events import _fast_path, _from_mapping

    fast = _fast_path(obj)
    try:
        slow = _from_mapping(obj)
    except EventRejected:
        assert fast is None
    else:
        assert fast is None or fast == slow
