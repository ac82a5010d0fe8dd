"""The msgspec decoder of ``parse_event`` against the reference validator (``_parse_reference``).

For any payload both must agree exactly: the same ``EventRejected`` reason and detail, or equal
events (compared by ``repr``, so 5 vs 5.0 and 0.0 vs -0.0 differ). Payloads are built as raw JSON
text, so that they can hold what a JSON writer never produces: duplicate keys, escaped keys,
``1e400``, 400-digit integers, ``NaN``, lone surrogates, invalid UTF-8, odd whitespace.
"""

from __future__ import annotations

import gc
import json
import math
import pickle
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcast.stats import events as ev
from kvcast.stats.events import (
    MAX_BLOCK_HASHES,
    MAX_ID_CHARS,
    MAX_LABEL_CHARS,
    MAX_SESSION_ID_CHARS,
    MAX_TOKENS,
    MAX_TURN,
    Event,
    EventRejected,
    _parse_reference,
    parse_event,
)
from tests.support import VALID

FIELDS = (
    "session_id", "turn", "timestamp", "input_tokens", "output_tokens", "request_id", "intent",
    "cached_tokens", "prompt", "messages", "type", "instance", "block_hashes", "schema",
)  # fmt: skip


class Raw(bytes):
    """JSON text put into a payload verbatim."""


class Pairs(list):
    """A JSON object as (key, value) pairs: keys may repeat, and a key may be Raw text."""


def dump(value: object, ascii_only: bool) -> bytes:
    """Raw JSON text of ``value`` (lone surrogates escaped, or encoded as invalid UTF-8)."""
    if isinstance(value, Raw):
        return bytes(value)
    if isinstance(value, Pairs | dict):
        items = value if isinstance(value, Pairs) else list(value.items())
        members = (dump(k, ascii_only) + b":" + dump(v, ascii_only) for k, v in items)
        return b"{" + b",".join(members) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(dump(item, ascii_only) for item in value) + b"]"
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def outcome(parse: Any, raw: object) -> tuple[str, str, str]:
    """("accepted", repr) or ("rejected", reason, detail): what a caller can observe."""
    try:
        event = parse(raw)
    except EventRejected as rejection:
        return ("rejected", rejection.reason, rejection.detail)
    assert type(event) is Event
    return ("accepted", repr(event), "")


def assert_agree(raw: bytes) -> tuple[str, str, str]:
    """parse_event and the reference agree on ``raw`` as bytes, bytearray, memoryview and str."""
    expected = outcome(_parse_reference, raw)
    assert outcome(parse_event, raw) == expected, raw[:300]
    assert outcome(parse_event, bytearray(raw)) == expected
    assert outcome(parse_event, memoryview(raw)) == expected
    text = raw.decode("utf-8", "surrogatepass") if _decodable(raw) else None
    if text is not None:
        assert outcome(parse_event, text) == outcome(_parse_reference, text), raw[:300]
    return expected


def _decodable(raw: bytes) -> bool:
    try:
        raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


# --- values: edges of every constraint, each JSON type, and text no JSON writer produces ---

INT_EDGES = (
    0, 1, -1, 2, 300, MAX_TURN, MAX_TURN + 1, MAX_TOKENS, MAX_TOKENS + 1, 2**53 + 1, 2**63 - 1,
    2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, 10**308, 10**309, 10**400,
)  # fmt: skip
FLOAT_EDGES = (
    0.0, -0.0, 0.5, 1.0, 2.0, 1700000000.25, 1e308, 1.7976931348623157e308, 5e-324, -1e-300,
    -1.0, 1e30, math.nan, math.inf, -math.inf,
)  # fmt: skip
RAW_TOKENS = tuple(
    Raw(t)
    for t in (
        b"1e400", b"-1e400", b"1e-400", b"-1e-400", b"-0", b"-0.0", b"0.0", b"1.0", b"1E2",
        b"1e0", b"2e0", b"1.5e+3", b"NaN", b"Infinity", b"-Infinity", b"9" * 400, b"01", b"1.",
        b".5", b"+1", b"0x10", b"18446744073709551616", b"-9223372036854775809",
        b"1.7976931348623159e308", b"123456789012345678901234567890", b"tru", b"nul", b"",
        b'"\xff"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xf0\x9f\x98"', b'"\\ud800"',
        b'"\\udc00"', b'"\\ud83d\\ude00"', b'"\\u00"', b'"\\x"', b'"a\tb"', b'"\x00"',
        b'"\x7f"', b'"\\/"', b"[1,]", b"{,}", b'{"a":1,}', b"[" * 40 + b"]" * 40,
        b"[" * 1100 + b"]" * 1100, b'{"role":"user","content":"x"}',
    )
)  # fmt: skip
STRING_EDGES = (
    "", "a", "s-1", "x" * 128, "x" * 129, "x" * 256, "x" * 257, "x" * 512, "x" * 513,
    "😀" * 128, "😀" * 129, "😀" * 256, "é" * 257, "\ud800", "x\udc00", "\x00", 'a"b', "\\",
    "\u2028", "\x1f",
)  # fmt: skip

scalars = st.one_of(
    st.sampled_from(INT_EDGES),
    st.integers(),
    st.sampled_from(FLOAT_EDGES),
    st.floats(),
    st.booleans(),
    st.none(),
    st.sampled_from(STRING_EDGES),
    st.text(max_size=12),
    st.sampled_from(RAW_TOKENS),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=6), children, max_size=3).map(lambda d: Pairs(d.items()))
    ),
    max_leaves=8,
)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "role": st.sampled_from(["user", "assistant"]) | scalars,
                "content": st.text(max_size=8) | scalars,
                "name": st.text(max_size=4) | scalars,
            },
        ).map(lambda d: Pairs(d.items())),
        st.builds(
            lambda r, c: Pairs([("role", r), ("role", "user"), ("content", c)]),
            scalars,
            st.text(max_size=4),
        ),
        scalars,
    ),
    max_size=4,
)
block_hashes = st.lists(
    st.sampled_from(INT_EDGES) | st.integers() | st.text(max_size=6) | scalars, max_size=5
)


def mostly(
    valid: st.SearchStrategy[object], other: st.SearchStrategy[object]
) -> st.SearchStrategy[object]:
    """``valid`` 85% of the time, so that most payloads get past their first field."""
    return st.integers(0, 19).flatmap(lambda k: valid if k < 17 else other)


def string_of(max_chars: int) -> st.SearchStrategy[object]:
    """Strings for a field of 1..``max_chars`` code points, their edges, and anything."""
    edges = ("x" * max_chars, "😀" * max_chars, "x" * (max_chars + 1), "😀" * (max_chars + 1), "")
    return mostly(st.text(min_size=1, max_size=8), st.sampled_from(edges) | json_values)


def int_in(low: int, high: int) -> st.SearchStrategy[object]:
    """Integers of ``low..high``, their neighbours, and anything."""
    edges = (low, high, low - 1, high + 1, float(low), Raw(b"1.0"), Raw(b"-0"), True)
    return mostly(
        st.integers(low, min(high, low + 1000)) | st.sampled_from((low, high)),
        st.sampled_from(edges) | json_values,
    )


FIELD_VALUES: dict[str, st.SearchStrategy[object]] = {
    "session_id": string_of(MAX_SESSION_ID_CHARS),
    "turn": int_in(1, MAX_TURN),
    "timestamp": mostly(
        st.floats(min_value=0, allow_infinity=False) | st.integers(0, 2**70),
        st.sampled_from(FLOAT_EDGES) | st.sampled_from(RAW_TOKENS) | json_values,
    ),
    "input_tokens": int_in(0, MAX_TOKENS),
    "output_tokens": int_in(0, MAX_TOKENS),
    "cached_tokens": int_in(0, 400) | st.none(),
    "request_id": string_of(MAX_ID_CHARS) | st.none(),
    "intent": string_of(MAX_LABEL_CHARS) | st.none(),
    "type": string_of(MAX_LABEL_CHARS) | st.none(),
    "instance": string_of(MAX_ID_CHARS) | st.none(),
    "prompt": mostly(st.text(max_size=20), json_values),
    "messages": mostly(messages, json_values),
    "block_hashes": mostly(block_hashes, json_values),
    "schema": mostly(
        st.just(1), st.sampled_from((1.0, True, "1", 2, 0, None, Raw(b"1.0"), Raw(b"1e0")))
    ),
}
REQUIRED = ("session_id", "turn", "timestamp", "input_tokens", "output_tokens")
# Key spellings: escaped forms decode to the contract's names; near misses are unknown fields.
KEY_VARIANTS = st.sampled_from(
    (
        Raw(b'"\\u0073ession_id"'), Raw(b'"tur\\u006e"'), Raw(b'"\\ud800"'), Raw(b'"k\xff"'),
        "Turn", "session_id ", "session_id\x00", "extra", "", "schema",
    )
)  # fmt: skip


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """An event as raw JSON: each field present or not, valid or not, maybe repeated."""
    pairs: list[tuple[object, object]] = []
    for field in FIELDS:
        required = field in REQUIRED
        if draw(st.integers(0, 39)) < (39 if required else 12):
            pairs.append((field, draw(FIELD_VALUES[field])))
    for _ in range(draw(st.sampled_from((0, 0, 0, 1, 1, 2, 3)))):
        kind = draw(st.integers(0, 3))
        if kind == 0 and pairs:  # a duplicate key, before or after the first, same or new value
            key, value = draw(st.sampled_from(pairs))
            value = value if draw(st.booleans()) else draw(FIELD_VALUES.get(key, json_values))
            pairs.insert(draw(st.integers(0, len(pairs))), (key, value))
        elif kind == 1:  # an unknown field
            pairs.append((draw(st.text(max_size=8)), draw(json_values)))
        elif kind == 2:  # a key spelled another way
            pairs.append((draw(KEY_VARIANTS), draw(json_values)))
        else:
            pairs = draw(st.permutations(pairs))
    raw = dump(Pairs(pairs), ascii_only=draw(st.booleans()))
    space = draw(st.sampled_from((b"",) * 12 + (b" ", b"\n", b"\r\n\t", b"\x0c")))
    return space + raw + space


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads())
def test_decoder_agrees_with_the_reference_on_generated_events(raw: bytes) -> None:
    assert_agree(raw)


@settings(max_examples=500, deadline=None)
@given(payloads(), st.data())
def test_decoder_agrees_on_mutated_events(raw: bytes, data: st.DataObject) -> None:
    """Truncations and byte edits of generated events."""
    at = data.draw(st.integers(0, len(raw)))
    edit = data.draw(st.sampled_from(("truncate", "flip", "insert")))
    if edit == "truncate":
        raw = raw[:at]
    elif edit == "flip" and raw:
        at = min(at, len(raw) - 1)
        raw = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1 :]
    else:
        raw = raw[:at] + data.draw(st.sampled_from(RAW_TOKENS)) + raw[at:]
    assert_agree(raw)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200) | json_values.map(lambda v: dump(v, ascii_only=False)))
def test_decoder_agrees_on_arbitrary_bytes_and_json_values(raw: bytes) -> None:
    assert_agree(raw)


def splice(text: bytes) -> bytes:
    """The valid event with ``text`` (raw JSON members) added at its end."""
    return orjson.dumps(VALID)[:-1] + b"," + text + b"}"


EDGE_CASES = {
    "duplicate turn, last wins": splice(b'"turn":7'),
    "duplicate turn, first invalid": b'{"turn":"x",' + orjson.dumps(VALID)[1:],
    "duplicate turn, last invalid": splice(b'"turn":0'),
    "schema 1 then 2": splice(b'"schema":1,"schema":2'),
    "schema 2 then 1": splice(b'"schema":2,"schema":1'),
    "schema true": splice(b'"schema":true'),
    "schema 1.0": splice(b'"schema":1.0'),
    "schema null": splice(b'"schema":null'),
    "timestamp 1e400": splice(b'"timestamp":1e400'),
    "timestamp 10**400": splice(b'"timestamp":' + b"1" + b"0" * 400),
    "timestamp 10**30": splice(b'"timestamp":1' + b"0" * 30),
    "timestamp 2**64-1": splice(b'"timestamp":18446744073709551615'),
    "timestamp -0": splice(b'"timestamp":-0'),
    "timestamp -0.0": splice(b'"timestamp":-0.0'),
    "timestamp -1e-400": splice(b'"timestamp":-1e-400'),
    "timestamp int": splice(b'"timestamp":12'),
    "tokens 10**30": splice(b'"input_tokens":1' + b"0" * 30),
    "tokens 1.0": splice(b'"input_tokens":1.0'),
    "cached over input": splice(b'"cached_tokens":301'),
    "cached equals input": splice(b'"cached_tokens":300'),
    "cached null": splice(b'"cached_tokens":null'),
    "request_id null": splice(b'"request_id":null'),
    "request_id empty": splice(b'"request_id":""'),
    "session_id 256 emoji": orjson.dumps({**VALID, "session_id": "😀" * 256}),
    "session_id 257 emoji": orjson.dumps({**VALID, "session_id": "😀" * 257}),
    "escaped key": splice(b'"\\u0069ntent":"code"'),
    "unknown field": splice(b'"extra":{"a":[1,2]}'),
    "unknown field, invalid UTF-8": splice(b'"extra":"\xff"'),
    "unknown field, 1e400": splice(b'"extra":1e400'),
    "unknown field, deep": splice(b'"extra":' + b"[" * 2000 + b"]" * 2000),
    "unknown field, 900 deep": splice(b'"extra":' + b"[" * 900 + b"]" * 900),
    "messages missing role": splice(b'"messages":[{"content":"x"}]'),
    "messages extra key": splice(b'"messages":[{"role":"u","content":"x","n":1}]'),
    "messages duplicate role": splice(b'"messages":[{"role":1,"role":"u","content":"x"}]'),
    "messages null": splice(b'"messages":null'),
    "block id 2**64-1": splice(b'"block_hashes":[18446744073709551615]'),
    "block id 2**64": splice(b'"block_hashes":[18446744073709551616]'),
    "block id -2**63-1": splice(b'"block_hashes":[-9223372036854775809]'),
    "block id bool": splice(b'"block_hashes":[true]'),
    "block ids": splice(b'"block_hashes":[1,"a",-9223372036854775808,""]'),
    "lone surrogate escape": splice(b'"prompt":"\\ud800"'),
    "surrogate pair": splice(b'"prompt":"\\ud83d\\ude00"'),
    "encoded surrogate": splice(b'"prompt":"\xed\xa0\x80"'),
    "form feed": b"\x0c" + orjson.dumps(VALID),
    "BOM": b"\xef\xbb\xbf" + orjson.dumps(VALID),
    "trailing newline": orjson.dumps(VALID) + b"\n",
    "trailing garbage": orjson.dumps(VALID) + b"x",
    "array": b"[" + orjson.dumps(VALID) + b"]",
    "empty": b"",
}


@pytest.mark.parametrize("raw", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_decoder_agrees_on_edge_cases(raw: bytes) -> None:
    assert_agree(raw)


def test_the_block_id_limit_is_reachable() -> None:
    # A 1 MiB payload holds at most ~500k ids: the limit can only matter if it shrinks.
    assert MAX_BLOCK_HASHES * 2 > ev.MAX_EVENT_BYTES


WELL_FORMED = [
    orjson.dumps(VALID),
    orjson.dumps({**VALID, "request_id": "r-9", "intent": "code_generation", "schema": 1}),
    orjson.dumps(
        {
            **VALID,
            "cached_tokens": 300,
            "prompt": "hello",
            "messages": [{"role": "user", "content": "hi", "name": "x"}],
            "type": "text",
            "instance": "prefill-0",
            "block_hashes": [1, "a2", -(2**63)],
            "timestamp": 7,
        }
    ),
]


@pytest.mark.parametrize("raw", WELL_FORMED)
def test_well_formed_events_never_reach_the_reference(
    raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _parse_reference(raw)

    def fail(raw: object) -> Event:
        raise AssertionError("took the reference path")

    monkeypatch.setattr(ev, "_parse_reference", fail)
    assert repr(parse_event(raw)) == repr(expected)
    assert repr(parse_event(raw.decode())) == repr(expected)


def test_event_constructs_compares_and_copies_like_the_dataclass_did() -> None:
    positional = Event("s", 1, 2.0, 10, 3, "r", "chat", 4, "p", [{"role": "u", "content": "c"}])
    keyword = Event(
        session_id="s",
        turn=1,
        timestamp=2.0,
        input_tokens=10,
        output_tokens=3,
        request_id="r",
        intent="chat",
        cached_tokens=4,
        prompt="p",
        messages=[{"role": "u", "content": "c"}],
    )
    assert positional == keyword and positional != Event("s", 1, 2.0, 10, 3, "other")
    assert positional.to_dict() == {
        "session_id": "s",
        "turn": 1,
        "timestamp": 2.0,
        "input_tokens": 10,
        "output_tokens": 3,
        "request_id": "r",
        "intent": "chat",
        "cached_tokens": 4,
        "prompt": "p",
        "messages": [{"role": "u", "content": "c"}],
    }
    assert pickle.loads(pickle.dumps(positional)) == positional
    positional.intent = "other"  # fields stay assignable
    assert positional.intent == "other"
    # Not tracked by the cycle collector (gc=False); its lists still are.
    assert not gc.is_tracked(positional) and gc.is_tracked(positional.messages)
    with pytest.raises(TypeError):
        Event("s", 1)  # type: ignore[call-arg]


def test_an_event_built_without_request_id_gets_the_contract_default() -> None:
    assert Event("s", 2, 0.0, 1, 1).request_id == "s\x1f2"
    assert Event("s", 2, 0.0, 1, 1, "").request_id == "s\x1f2"
    assert (
        parse_event(orjson.dumps(VALID)).request_id == f"{VALID['session_id']}\x1f{VALID['turn']}"
    )
