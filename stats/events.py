"""The event contract (schema version 1): one served request, validated.

``parse_event`` turns raw bytes, text or an already-decoded mapping into an :class:`Event`,
or raises :class:`EventRejected` whose ``reason`` is one of :data:`REJECT_REASONS` (a bounded
set, safe as a metric label) and whose ``detail`` says which field was wrong and how. The
detail never echoes user text.

Raw payloads are first decoded by msgspec straight into :class:`Event`, whose field types carry
the contract's constraints; that decoder is stricter than the contract (no unknown fields, no
block id beyond int64, ...), so whatever it refuses goes to the reference validator
(``_parse_reference``: orjson, then ``_fast_path`` / ``_from_mapping``), which decides and names
the problem. Either way the outcome is the reference's.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
import orjson
from msgspec import Meta

SCHEMA_VERSION = 1
MAX_EVENT_BYTES = 1 << 20
MAX_SESSION_ID_CHARS = 256
MAX_ID_CHARS = 512
MAX_LABEL_CHARS = 128
MAX_TURN = 1_000_000
MAX_TOKENS = 1_000_000_000
MAX_BLOCK_HASHES = 1_000_000

REJECT_REASONS: tuple[str, ...] = (
    "oversized",
    "invalid_json",
    "not_an_object",
    "unsupported_schema",
    "missing_field",
    "wrong_type",
    "out_of_range",
    "non_finite",
    "cached_exceeds_input",
    "too_late",
    "future",
    "open_limit",
)


class EventRejected(ValueError):
    """An event that breaks the contract. ``reason`` is a bounded label, ``detail`` explains,
    ``field`` names the contract field at fault (None when the payload as a whole is)."""

    def __init__(self, reason: str, detail: str, field: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.field = field


# Field types as msgspec checks them while decoding (never on construction). Lengths count code
# points, as len() does. Block ids: orjson turns integers outside [-2**63, 2**64) into floats,
# which the contract rejects; msgspec bounds stop at int64, so ids in [2**63, 2**64) take the
# reference path (stricter is safe: the reference still accepts them).
_SessionId = Annotated[str, Meta(min_length=1, max_length=MAX_SESSION_ID_CHARS)]
_Id = Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
_Label = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
_Turn = Annotated[int, Meta(ge=1, le=MAX_TURN)]
_Tokens = Annotated[int, Meta(ge=0, le=MAX_TOKENS)]
_Seconds = Annotated[float, Meta(ge=0)]  # JSON ints decode as floats; out-of-range ones fail
_BlockId = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)] | str
_BlockIds = Annotated[list[_BlockId], Meta(max_length=MAX_BLOCK_HASHES)]


class Event(
    msgspec.Struct,
    # `schema` is the tag: optional when decoding, and if present exactly the int 1.
    tag_field="schema",
    tag=SCHEMA_VERSION,
    # Unknown fields go to the reference, which ignores them: msgspec skips an unknown value
    # without checking its UTF-8, numbers or depth, which orjson (the reference) rejects.
    forbid_unknown_fields=True,
    # Not tracked by the cycle collector: an Event holds strings, numbers and lists of those
    # (decoded JSON cannot form a cycle), and allocating one then does not advance gen-0 counts.
    gc=False,
):
    """One served request. Times in seconds of event time, sizes in tokens.

    ``request_id`` left out (or empty, when built in code) becomes the contract's default,
    ``session_id`` + U+001F + ``turn``.
    """

    session_id: _SessionId
    turn: _Turn
    timestamp: _Seconds
    input_tokens: _Tokens
    output_tokens: _Tokens
    request_id: _Id = ""
    intent: _Label | None = None
    cached_tokens: _Tokens | None = None
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    type: _Label | None = None
    instance: _Id | None = None
    block_hashes: _BlockIds | None = None

    def __post_init__(self) -> None:
        # Runs after decoding too; an explicit "" in JSON never gets here (min_length).
        if not self.request_id:
            self.request_id = f"{self.session_id}\x1f{self.turn}"

    def to_dict(self) -> dict[str, Any]:
        """The event as a contract-shaped mapping (None fields left out)."""
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


_decode = msgspec.json.Decoder(Event).decode


def parse_event(raw: bytes | bytearray | memoryview | str | dict[str, Any]) -> Event:
    """Validate one event; raise :class:`EventRejected` naming the first problem found."""
    if type(raw) is not bytes or len(raw) > MAX_EVENT_BYTES:  # bytes within size: no call
        if isinstance(raw, dict):
            return _parse_reference(raw)
        raw = _within_size(raw)
    try:
        event = _decode(raw)
    except Exception:  # any refusal (or msgspec failure): the reference decides and explains
        return _parse_reference(raw)
    # The native replay engine repeats these two checks (stats/native/_replay.c, decoded_is_final):
    # keep the two in step.
    cached = event.cached_tokens
    if (cached is not None and cached > event.input_tokens) or (
        event.messages is not None and not _messages_complete(event.messages)
    ):
        return _parse_reference(raw)
    return event


def _within_size(raw: bytes | bytearray | memoryview | str) -> bytes | bytearray | memoryview:
    """The payload as bytes (text as UTF-8); EventRejected when over :data:`MAX_EVENT_BYTES`."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_EVENT_BYTES:
        raise EventRejected("oversized", f"{len(raw)} bytes exceeds {MAX_EVENT_BYTES}")
    return raw


def _messages_complete(messages: list[dict[str, str]]) -> bool:
    """Every message has a role and a content (the decoder already made all values strings)."""
    return all("role" in message and "content" in message for message in messages)


def _parse_reference(raw: bytes | bytearray | memoryview | str | dict[str, Any]) -> Event:
    """The reference validator: orjson, then the checks below; its outcome is the contract's."""
    if isinstance(raw, dict):
        obj: Any = raw
    else:
        raw = _within_size(raw)
        try:
            obj = _loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EventRejected("invalid_json", _json_error(exc)) from None
    if type(obj) is not dict:
        if not isinstance(obj, dict):
            raise EventRejected("not_an_object", f"expected a JSON object, got {_kind(obj)}")
        return _from_mapping(obj)
    return _fast_path(obj) or _from_mapping(obj)


_loads = orjson.loads
_INF = math.inf
# Contract fields only the detailed validator checks: events carrying one take the slow path.
# (Unknown fields are ignored by both paths.)
_SLOW_FIELDS = frozenset(("messages", "type", "instance", "block_hashes"))


def _fast_path(obj: dict[str, Any]) -> Event | None:
    """The common well-formed event, checked inline; None sends it to the detailed validator.

    Exactly the checks of ``_from_mapping`` for events without the fields of
    :data:`_SLOW_FIELDS`; anything unusual or wrong takes the slow path, which names the
    problem. The Event is built positionally (keyword calls cost three times as much).
    """
    get = obj.get
    session_id = get("session_id")
    turn = get("turn")
    timestamp = get("timestamp")
    input_tokens = get("input_tokens")
    output_tokens = get("output_tokens")
    if not (
        type(session_id) is str
        and type(turn) is int
        and type(input_tokens) is int
        and type(output_tokens) is int
        and (type(timestamp) is float or type(timestamp) is int)
        and 0 < len(session_id) <= MAX_SESSION_ID_CHARS
        and 1 <= turn <= MAX_TURN
        and 0 <= input_tokens <= MAX_TOKENS
        and 0 <= output_tokens <= MAX_TOKENS
        and 0 <= timestamp < _INF
        and _SLOW_FIELDS.isdisjoint(obj)
    ):
        return None
    request_id = get("request_id")
    intent = get("intent")
    cached_tokens = get("cached_tokens")
    prompt = get("prompt")
    if not (
        (request_id is None or (type(request_id) is str and 0 < len(request_id) <= MAX_ID_CHARS))
        and (intent is None or (type(intent) is str and 0 < len(intent) <= MAX_LABEL_CHARS))
        and (
            cached_tokens is None
            or (type(cached_tokens) is int and 0 <= cached_tokens <= input_tokens)
        )
        and (prompt is None or type(prompt) is str)
        and get("schema", SCHEMA_VERSION) is SCHEMA_VERSION
    ):
        return None
    return Event(
        session_id,
        turn,
        float(timestamp),
        input_tokens,
        output_tokens,
        request_id if request_id is not None else f"{session_id}\x1f{turn}",
        intent,
        cached_tokens,
        prompt,
    )


def _from_mapping(obj: dict[str, Any]) -> Event:
    schema = obj.get("schema", SCHEMA_VERSION)
    if type(schema) is not int or schema != SCHEMA_VERSION:
        # A version number is safe to quote; anything else is producer data and is not.
        got = (
            f"version {schema}"
            if type(schema) is int and 0 <= schema < 1000
            else f"a {_kind(schema)}"
        )
        raise EventRejected(
            "unsupported_schema",
            f"field 'schema': {got}, expected the integer {SCHEMA_VERSION}",
            field="schema",
        )
    session_id = _string(obj, "session_id", MAX_SESSION_ID_CHARS, required=True)
    turn = _int(obj, "turn", 1, MAX_TURN, required=True)
    timestamp = _time(obj, "timestamp")
    input_tokens = _int(obj, "input_tokens", 0, MAX_TOKENS, required=True)
    output_tokens = _int(obj, "output_tokens", 0, MAX_TOKENS, required=True)
    cached_tokens = _int(obj, "cached_tokens", 0, MAX_TOKENS, required=False)
    if cached_tokens is not None and cached_tokens > input_tokens:
        raise EventRejected(
            "cached_exceeds_input",
            f"field 'cached_tokens': {cached_tokens} exceeds input_tokens {input_tokens}",
            field="cached_tokens",
        )
    request_id = _string(obj, "request_id", MAX_ID_CHARS, required=False)
    return Event(
        session_id=session_id,  # type: ignore[arg-type]
        turn=turn,  # type: ignore[arg-type]
        timestamp=timestamp,
        input_tokens=input_tokens,  # type: ignore[arg-type]
        output_tokens=output_tokens,  # type: ignore[arg-type]
        request_id=request_id if request_id is not None else f"{session_id}\x1f{turn}",
        intent=_string(obj, "intent", MAX_LABEL_CHARS, required=False),
        cached_tokens=cached_tokens,
        prompt=_text(obj, "prompt"),
        messages=_messages(obj),
        type=_string(obj, "type", MAX_LABEL_CHARS, required=False),
        instance=_string(obj, "instance", MAX_ID_CHARS, required=False),
        block_hashes=_block_hashes(obj),
    )


def _missing(field: str) -> EventRejected:
    return EventRejected("missing_field", f"field '{field}' is required", field=field)


def _string(obj: dict[str, Any], field: str, max_chars: int, *, required: bool) -> str | None:
    value = obj.get(field)
    if value is None:
        if required:
            raise _missing(field)
        return None
    if not isinstance(value, str):
        raise EventRejected(
            "wrong_type", f"field '{field}': expected a string, got {_kind(value)}", field=field
        )
    if not 1 <= len(value) <= max_chars:
        raise EventRejected(
            "out_of_range",
            f"field '{field}': length {len(value)} is not within 1..{max_chars}",
            field=field,
        )
    return value


def _int(obj: dict[str, Any], field: str, low: int, high: int, *, required: bool) -> int | None:
    value = obj.get(field)
    if value is None:
        if required:
            raise _missing(field)
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and not math.isfinite(value):
            raise EventRejected(
                "non_finite", f"field '{field}': {value!r} is not finite", field=field
            )
        raise EventRejected(
            "wrong_type", f"field '{field}': expected an integer, got {_kind(value)}", field=field
        )
    if not low <= value <= high:
        raise EventRejected(
            "out_of_range", f"field '{field}': {value} is not within {low}..{high}", field=field
        )
    return value


def _time(obj: dict[str, Any], field: str) -> float:
    value = obj.get(field)
    if value is None:
        raise _missing(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventRejected(
            "wrong_type", f"field '{field}': expected a number, got {_kind(value)}", field=field
        )
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise EventRejected(
            "non_finite", f"field '{field}': not a finite number of seconds", field=field
        )
    if value < 0:
        raise EventRejected("out_of_range", f"field '{field}': {value} is negative", field=field)
    return value


def _text(obj: dict[str, Any], field: str) -> str | None:
    value = obj.get(field)
    if value is None or isinstance(value, str):
        return value
    raise EventRejected(
        "wrong_type", f"field '{field}': expected a string, got {_kind(value)}", field=field
    )


def _messages(obj: dict[str, Any]) -> list[dict[str, str]] | None:
    value = obj.get("messages")
    if value is None:
        return None
    if not isinstance(value, list):
        raise EventRejected(
            "wrong_type", f"field 'messages': expected a list, got {_kind(value)}", field="messages"
        )
    for index, message in enumerate(value):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise EventRejected(
                "wrong_type",
                f"field 'messages[{index}]': expected an object with string 'role' and 'content'",
                field="messages",
            )
    return value


def _block_hashes(obj: dict[str, Any]) -> list[int | str] | None:
    value = obj.get("block_hashes")
    if value is None:
        return None
    if not isinstance(value, list):
        raise EventRejected(
            "wrong_type",
            f"field 'block_hashes': expected a list, got {_kind(value)}",
            field="block_hashes",
        )
    if len(value) > MAX_BLOCK_HASHES:
        raise EventRejected(
            "out_of_range",
            f"field 'block_hashes': {len(value)} ids exceed {MAX_BLOCK_HASHES}",
            field="block_hashes",
        )
    for index, block in enumerate(value):
        if isinstance(block, bool) or not isinstance(block, int | str):
            raise EventRejected(
                "wrong_type",
                f"field 'block_hashes[{index}]': expected an integer or string, got {_kind(block)}",
                field="block_hashes",
            )
    return value


def _kind(value: object) -> str:
    """JSON name of a value's type, for messages (never the value itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _json_error(exc: orjson.JSONDecodeError) -> str:
    return f"not valid UTF-8 JSON ({exc.msg} at position {exc.pos})"
