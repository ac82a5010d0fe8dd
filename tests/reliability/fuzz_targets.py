"""Coverage-guided fuzz targets (atheris/libFuzzer) for the event contract and the pipeline.

Usage (from the repository root)::

    .venv/bin/python -m tests.reliability.fuzz_targets TARGET [libFuzzer flags...] [CORPUS_DIR...]

Targets:

- ``parse``: the input bytes go to ``parse_event``. Any exception other than ``EventRejected``
  is a crash; a rejection's reason must be in ``REJECT_REASONS`` and its detail short, with no
  string of the event echoed in it; an accepted ``Event`` must keep the contract of SPEC
  section 2 (types, ranges, ``cached_tokens <= input_tokens``, finite timestamp >= 0, ...) and
  carry the decoded object's values. The same payload as text and as a decoded mapping must
  give the same outcome, and the fast path must agree with the detailed validator.
- ``pipeline``: the input drives an ``atheris.FuzzedDataProvider`` that picks a small
  ``StatsConfig`` and up to 50 events (valid-looking JSON objects whose fields may be dropped,
  duplicated or replaced by fuzzed values of any JSON type, raw numeric text such as ``1e400``
  or ``NaN``, unicode with lone surrogates, nested objects, or raw bytes), fed through a
  ``Pipeline``; then ``engine.finish()`` and ``engine.snapshot()``. Nothing may raise, the
  counters must add up to the events offered, and the snapshot must be sane (probabilities and
  the observed hit ratio in [0, 1], finite positive medians, window sizes consistent).

Only kvcast's modules are instrumented. Unless a corpus directory or input file is named, a
temporary corpus is used, seeded with valid events and one event per rejection path (a named
directory that is empty is seeded too); a dictionary of the contract's field names and JSON
tokens is passed as ``-dict=`` unless one is given, and ``-max_len=4096`` unless set. The
fuzzer runs in a child process (libFuzzer exits the process when done); this script passes its
output through to stderr and prints one line to stdout at the end::

    FUZZ target=parse status=ok rc=0 runs=123456 cov=312 ft=1024 corpus=180

(``status``: ``ok``; ``crash`` when an input failed; ``error`` when the fuzzer did not start.
The exit status is the fuzzer's: 0, or 77 for a failing input, 70 for a timeout.) A crash leaves
the input in ``crash-<sha1>`` (see ``-artifact_prefix=``); rerun it with
``python -m tests.reliability.fuzz_targets parse crash-<sha1>``.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TARGETS = ("parse", "pipeline")
MAX_EVENTS = 50
# A rejection's detail names a field and a problem; user text would make it long.
MAX_DETAIL_CHARS = 200
# Fields of the contract (SPEC section 2), and a name it does not know.
FIELDS = (
    "session_id", "turn", "timestamp", "input_tokens", "output_tokens", "request_id", "prompt",
    "messages", "intent", "cached_tokens", "type", "instance", "block_hashes", "schema",
)  # fmt: skip
# Strings a rejection detail may quote: field names, list items and the message keys.
QUOTED_IN_DETAILS = frozenset((*FIELDS, "role", "content"))
QUOTED_ITEM = re.compile(r"(messages|block_hashes)\[\d+\]")
# Expiry of the window runs every 1024 completions in production; the pipeline target lowers
# it so that its short sequences reach that code too.
FUZZ_EXPIRE_EVERY_COMPLETIONS = 3

SEED_EVENTS: tuple[dict[str, object], ...] = (
    {"session_id": "s", "turn": 1, "timestamp": 5.0, "input_tokens": 10, "output_tokens": 2},
    {
        "session_id": "conv-42",
        "turn": 3,
        "timestamp": 1717171717.25,
        "input_tokens": 2048,
        "output_tokens": 128,
        "request_id": "req-0001",
        "intent": "coding",
        "cached_tokens": 1024,
        "prompt": "and now in Rust?",
        "type": "text",
        "instance": "engine-0",
        "schema": 1,
    },
    {
        "session_id": "c",
        "turn": 2,
        "timestamp": 12,
        "input_tokens": 0,
        "output_tokens": 0,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ],
        "block_hashes": [1, 2, "3f9a", 18446744073709551615],
    },
    {
        "session_id": "\u00e9\u4e2d\U0001f600",
        "turn": 1000000,
        "timestamp": 0,
        "input_tokens": 1000000000,
        "output_tokens": 1,
        "cached_tokens": 0,
        "unknown_field": {"nested": [None, True, False, -1.5e-3]},
    },
)
# JSON tokens and field names for the -dict= file (libFuzzer's dictionary format).
DICTIONARY_TOKENS: tuple[bytes, ...] = (
    *(f'"{name}"'.encode() for name in FIELDS),
    *(f'"{name}":'.encode() for name in FIELDS),
    b'"role"', b'"content"', b'{"role":"user","content":"x"}',
    b"{", b"}", b"[", b"]", b":", b",", b'"', b'""', b"{}", b"[]", b"true", b"false", b"null",
    b"0", b"1", b"-1", b"-0", b"0.5", b"1e400", b"-1e400", b"1e-400", b"1E+2",
    b"NaN", b"Infinity", b"-Infinity", b"1000000", b"1000001", b"1000000000", b"1000000001",
    b"9223372036854775807", b"9223372036854775808", b"18446744073709551615",
    b"18446744073709551616", b"\\u0000", b"\\ud800", b"\\udc00", b"\\ud83d\\ude00", b"\\\\",
    b'\\"', b"\xc3\xa9", b"\xed\xa0\x80", b"\xff",
)  # fmt: skip
# JSON number-ish text put verbatim into the pipeline target's events.
NUMERIC_TEXT = (
    "1e400", "-1e400", "1e-400", "NaN", "Infinity", "-Infinity", "-0", "-0.0", "0.0", "1.0",
    "1E2", "0x10", "01", "+1", ".5", "1.", "9" * 30, "-" + "9" * 25, "18446744073709551616",
    "9223372036854775808", "true", "null", '"1"',
)  # fmt: skip
SESSIONS = ("a", "b", "c", "d", "e", "f")
INTENTS = ("code_debugging", "chitchat", "x1", "coding", "unknown")  # in, extra, out, unknown


class FuzzFailure(AssertionError):
    """An invariant broken by a fuzzed input (a finding, like an uncaught exception)."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise FuzzFailure(message)


# --- the parse target -----------------------------------------------------------------------


def make_parse_target():
    """The ``parse`` test function; kvcast is imported (instrumented) here."""
    import orjson

    from kvcast.stats import events as ev

    Event, EventRejected, parse_event = ev.Event, ev.EventRejected, ev.parse_event
    reasons = frozenset(ev.REJECT_REASONS)

    def outcome(raw: object) -> tuple[str, object]:
        try:
            return "accepted", parse_event(raw)  # type: ignore[arg-type]
        except EventRejected as rejection:
            check_rejection(rejection, raw if isinstance(raw, dict) else None)
            return "rejected", rejection.reason

    def check_rejection(rejection: Exception, obj: dict | None) -> None:
        reason, detail = rejection.reason, rejection.detail  # type: ignore[attr-defined]
        check(reason in reasons, f"rejection reason {reason!r} is not in REJECT_REASONS")
        check(isinstance(detail, str), f"rejection detail {detail!r} is not a string")
        check(
            len(detail) <= MAX_DETAIL_CHARS,
            f"{reason}: detail of {len(detail)} chars (over {MAX_DETAIL_CHARS}): {detail[:300]!r}",
        )
        if obj is not None:
            for text in strings_in(obj):
                if text not in QUOTED_IN_DETAILS and not QUOTED_ITEM.fullmatch(text):
                    check(
                        repr(text) not in detail,
                        f"{reason}: the detail echoes user text {text!r}: {detail!r}",
                    )

    def check_event(event: object, obj: object) -> None:
        check(type(event) is Event, f"parse_event returned {type(event).__name__}")
        assert isinstance(event, Event)
        check(type(obj) is dict, f"accepted a JSON {type(obj).__name__}, not an object")
        assert isinstance(obj, dict)
        schema = obj.get("schema")
        check(
            schema is None or (schema == ev.SCHEMA_VERSION and type(schema) is not bool),
            f"accepted schema {schema!r}",
        )
        sid = event.session_id
        check(
            type(sid) is str and 1 <= len(sid) <= ev.MAX_SESSION_ID_CHARS,
            f"session_id {sid!r}",
        )
        check(
            type(event.turn) is int and 1 <= event.turn <= ev.MAX_TURN,
            f"turn {event.turn!r}",
        )
        ts = event.timestamp
        check(type(ts) is float and math.isfinite(ts) and ts >= 0, f"timestamp {ts!r}")
        for name in ("input_tokens", "output_tokens"):
            value = getattr(event, name)
            check(type(value) is int and 0 <= value <= ev.MAX_TOKENS, f"{name} {value!r}")
        cached = event.cached_tokens
        check(
            cached is None or (type(cached) is int and 0 <= cached <= event.input_tokens),
            f"cached_tokens {cached!r} with input_tokens {event.input_tokens!r}",
        )
        for name, limit in (
            ("request_id", ev.MAX_ID_CHARS),
            ("intent", ev.MAX_LABEL_CHARS),
            ("type", ev.MAX_LABEL_CHARS),
            ("instance", ev.MAX_ID_CHARS),
        ):
            value = getattr(event, name)
            check(
                value is None or (type(value) is str and 1 <= len(value) <= limit),
                f"{name} {value!r}",
            )
        check(event.request_id is not None, "request_id left None")
        check(event.prompt is None or type(event.prompt) is str, f"prompt {event.prompt!r}")
        messages = event.messages
        check(
            messages is None
            or (
                type(messages) is list
                and all(
                    type(m) is dict
                    and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)
                    for m in messages
                )
            ),
            f"messages {messages!r}",
        )
        blocks = event.block_hashes
        check(
            blocks is None
            or (
                type(blocks) is list
                and len(blocks) <= ev.MAX_BLOCK_HASHES
                and all(type(b) is int or type(b) is str for b in blocks)
            ),
            f"block_hashes {blocks!r}",
        )
        # The event carries the object's values (unknown fields ignored, defaults as documented).
        for name in ("session_id", "turn", "input_tokens", "output_tokens"):
            check(getattr(event, name) == obj[name], f"{name} differs from the object's")
        check(float(obj["timestamp"]) == ts, "timestamp differs from the object's")
        for name in ("intent", "cached_tokens", "prompt", "messages", "type", "instance"):
            check(getattr(event, name) == obj.get(name), f"{name} differs from the object's")
        check(event.block_hashes == obj.get("block_hashes"), "block_hashes differ")
        default_id = f"{sid}\x1f{event.turn}"
        check(
            event.request_id == (obj.get("request_id") or default_id),
            f"request_id {event.request_id!r} is neither the object's nor the default",
        )

    def test_one_input(data: bytes) -> None:
        kind, result = outcome(data)
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
            check(kind == "rejected", "accepted a payload orjson cannot decode")
        if kind == "accepted":
            check_event(result, obj)
            # The detailed validator must accept what the fast path took, with the same event.
            try:
                detailed: object = ev._from_mapping(obj)
            except EventRejected as rejection:
                detailed = f"rejected ({rejection.reason}: {rejection.detail})"
            check(detailed == result, f"parse_event gave {result!r}, _from_mapping {detailed!r}")
        elif type(obj) is dict:
            check_rejection_of_mapping(obj, result)
        # The same payload as text, and as an already decoded mapping, gives the same outcome.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            check(outcome(text) == (kind, result), "bytes and str payloads disagree")
        if type(obj) is dict:
            check(outcome(obj) == (kind, result), "bytes and mapping payloads disagree")

    def check_rejection_of_mapping(obj: dict, reason: object) -> None:
        try:
            ev._from_mapping(obj)
        except EventRejected as rejection:
            check(rejection.reason == reason, "the validator's reason changed between calls")
            check_rejection(rejection, obj)
        else:
            check(False, f"parse_event rejected ({reason}) what _from_mapping accepts")

    return test_one_input


def strings_in(value: object, depth: int = 0):
    """Every string (keys included) inside a decoded JSON value."""
    if isinstance(value, str):
        yield value
    elif depth < 64 and isinstance(value, list):
        for item in value:
            yield from strings_in(item, depth + 1)
    elif depth < 64 and isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings_in(item, depth + 1)


# --- the pipeline target --------------------------------------------------------------------


class RawJson(str):
    """JSON text put into an event verbatim (numbers JSON writers would not produce)."""


def make_pipeline_target():
    """The ``pipeline`` test function; kvcast is imported (instrumented) here."""
    import json

    import atheris

    from kvcast.stats import engine as engine_module
    from kvcast.stats.config import StatsConfig
    from kvcast.stats.events import REJECT_REASONS
    from kvcast.stats.labeller import IntentLabeller
    from kvcast.stats.replay import Pipeline
    from kvcast.stats.taxonomy import label_map

    engine_module.EXPIRE_EVERY_COMPLETIONS = FUZZ_EXPIRE_EVERY_COMPLETIONS
    reasons = frozenset(REJECT_REASONS)
    engine_reasons = frozenset(("too_late", "future", "open_limit"))  # outcomes of valid events

    def fuzz_value(fdp, depth: int) -> object:
        kind = fdp.ConsumeIntInRange(0, 13 if depth < 3 else 10)
        if kind == 0:
            return None
        if kind == 1:
            return fdp.ConsumeBool()
        if kind == 2:
            return fdp.ConsumeIntInRange(-3, 40)
        if kind == 3:
            return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 17))  # up to 136-bit integers
        if kind == 4:
            return fdp.ConsumeFloat()  # NaN and infinities included
        if kind == 5:
            return fdp.ConsumeRegularFloat()
        if kind == 6:
            return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 24))  # lone surrogates too
        if kind == 7:
            return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(1, 24))
        if kind == 8:
            return RawJson(NUMERIC_TEXT[fdp.ConsumeIntInRange(0, len(NUMERIC_TEXT) - 1)])
        if kind == 9:
            return "x" * fdp.ConsumeIntInRange(0, 600)  # over the length limits
        if kind == 10:
            return fdp.ConsumeIntInRange(0, 1_000_001) * (1 if fdp.ConsumeBool() else -1)
        if kind == 11:
            return [fuzz_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        if kind == 12:
            return {
                fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 8)): fuzz_value(
                    fdp, depth + 1
                )
                for _ in range(fdp.ConsumeIntInRange(0, 4))
            }
        return [
            {"role": fuzz_value(fdp, depth + 1), "content": fuzz_value(fdp, depth + 1)}
            for _ in range(fdp.ConsumeIntInRange(0, 3))
        ]

    def dumps(value: object, ascii_only: bool) -> str:
        if isinstance(value, RawJson):
            return str(value)
        return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)

    def payload(fdp, clock: list[float], request_ids: list[str]) -> bytes | str:
        if fdp.ConsumeIntInRange(0, 15) == 0:
            return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 80))
        clock[0] = max(0.0, clock[0] + fdp.ConsumeIntInRange(-300, 4000) / 4)
        input_tokens = fdp.ConsumeIntInRange(0, 5000)
        fields: list[tuple[str, object]] = [
            ("session_id", SESSIONS[fdp.ConsumeIntInRange(0, len(SESSIONS) - 1)]),
            ("turn", fdp.ConsumeIntInRange(1, 6)),
            ("timestamp", clock[0]),
            ("input_tokens", input_tokens),
            ("output_tokens", fdp.ConsumeIntInRange(0, 500)),
        ]
        optional = fdp.ConsumeIntInRange(0, 255)
        if optional & 1:
            if request_ids and fdp.ConsumeBool():
                request_id = request_ids[fdp.ConsumeIntInRange(0, len(request_ids) - 1)]
            else:
                request_id = f"r{len(request_ids)}"
                request_ids.append(request_id)
            fields.append(("request_id", request_id))
        if optional & 2:
            fields.append(("cached_tokens", fdp.ConsumeIntInRange(0, input_tokens + 1)))
        if optional & 4:
            fields.append(("intent", INTENTS[fdp.ConsumeIntInRange(0, len(INTENTS) - 1)]))
        if optional & 8:
            fields.append(("prompt", fdp.ConsumeUnicodeNoSurrogates(8)))
        if optional & 16:
            fields.append(("messages", [{"role": "user", "content": "q"}]))
        if optional & 32:
            fields.append(("block_hashes", [1, 2, "b3"]))
        if optional & 64:
            fields.append(("schema", 1))
        for _ in range(fdp.ConsumeIntInRange(0, 3)):  # mutations
            pick = fdp.ConsumeIntInRange(0, len(FIELDS) + 1)
            if pick < len(FIELDS):
                name = FIELDS[pick]
            elif pick == len(FIELDS):
                name = "extra"
            else:
                name = fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 6))
            action = fdp.ConsumeIntInRange(0, 3)
            if action == 0:  # drop the field
                fields = [(key, value) for key, value in fields if key != name]
            elif action == 1:  # a second copy (duplicate keys: the decoder keeps the last)
                fields.append((name, fuzz_value(fdp, 0)))
            else:  # replace it
                value = fuzz_value(fdp, 0)
                fields = [(key, v) for key, v in fields if key != name] + [(name, value)]
        ascii_only = fdp.ConsumeBool()
        text = "{" + ",".join(f"{dumps(k, ascii_only)}:{dumps(v, ascii_only)}" for k, v in fields)
        text += "}"
        if fdp.ConsumeBool():
            return text
        return text.encode("utf-8", "surrogatepass")

    def test_one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        pick = fdp.PickValueInList
        # Small values mostly, so that short sequences complete conversations, expire window
        # buckets, prune the arrival counters and hit the open-conversation limit.
        config = StatsConfig(
            block_size=pick([1, 2, 16, 64]),
            completion_timeout_s=pick([1.0, 5.0, 30.0, 300.0, 1800.0]),
            allowed_lateness_s=pick([0.0, 1.0, 10.0, 60.0, 600.0]),
            max_turn=fdp.ConsumeIntInRange(1, 8),
            window_conversations=fdp.ConsumeIntInRange(1, 20),
            window_max_age_s=pick([1.0, 60.0, 3600.0, 86_400.0]),
            bucket_s=pick([1.0, 7.0, 60.0, 600.0]),
            rate_window_s=pick([1, 2, 5, 10, 60, 600]),
            min_delay_samples=fdp.ConsumeIntInRange(1, 3),
            max_open_conversations=fdp.ConsumeIntInRange(1, 8),
        )
        extra = [f"x{n}" for n in range(fdp.ConsumeIntInRange(0, 4))]
        labeller = IntentLabeller(label_map=label_map(pick([30, 20, 10]), extra))
        pipeline = Pipeline(config, labeller)
        clock = [float(fdp.ConsumeIntInRange(0, 2_000_000_000))]
        if fdp.ConsumeIntInRange(0, 15) == 0:
            clock[0] = abs(fdp.ConsumeRegularFloat())  # anywhere up to 1.8e308
        request_ids: list[str] = []
        offered = valid = 0
        for _ in range(fdp.ConsumeIntInRange(0, MAX_EVENTS)):
            raw = payload(fdp, clock, request_ids)
            offered += 1
            if pipeline.offer(raw):
                valid += 1
            else:
                rejection = pipeline.last_rejection
                check(rejection is not None, "offer() returned False with no rejection")
                check(rejection.reason in reasons, f"rejection reason {rejection.reason!r}")

        engine = pipeline.engine
        counters = engine.counters
        rejected = counters.rejected
        check(set(rejected) <= reasons, f"unknown rejection reasons {sorted(rejected)}")
        check(all(n > 0 for n in rejected.values()), f"rejection counts {dict(rejected)}")
        check(counters.processed >= 0 and counters.duplicates >= 0, "negative counters")
        counted = counters.processed + counters.duplicates + sum(rejected.values())
        check(
            counted == offered, f"counters {counters.to_dict()} add up to {counted}, not {offered}"
        )
        engine_rejected = sum(n for reason, n in rejected.items() if reason in engine_reasons)
        check(
            counters.processed + counters.duplicates + engine_rejected == valid,
            f"{valid} valid events, counters {counters.to_dict()}",
        )
        states = set(labeller.label_map.values())
        check(labeller.labels <= states, "intent labels outside the taxonomy")

        engine.finish()
        snapshot = engine.snapshot()
        check_snapshot(snapshot, counters.processed, config)

    def check_snapshot(snapshot, processed: int, config) -> None:
        sample = snapshot.sample
        conversations = snapshot.window_conversations
        check(0 <= conversations <= processed, f"{conversations} conversations, {processed} events")
        by_intent = sum(m.conversations for m in sample.by_intent)
        check(by_intent == conversations, f"intents hold {by_intent} of {conversations}")
        check(len(sample.intents) == len(sample.by_intent), "intents and moments differ in length")
        delays = 0
        for state in snapshot.states:
            name = f"state ({state.intent!r}, {state.turn})"
            check(1 <= state.turn <= config.max_turn, f"{name}: turn out of 1..max_turn")
            check(0 <= state.continued <= state.conversations, f"{name}: continued > reached")
            check(0.0 <= state.p_continue <= 1.0, f"{name}: p_continue {state.p_continue!r}")
            median = state.median_reuse_s
            check(math.isfinite(median) and median > 0, f"{name}: median {median!r}")
            check(state.sigma is None or state.sigma >= 0, f"{name}: sigma {state.sigma!r}")
            check(state.delay_samples >= 0, f"{name}: {state.delay_samples} delay samples")
            delays += state.delay_samples
        check(delays == len(sample.delay_s), f"{delays} state delays, {len(sample.delay_s)} kept")
        check(
            bool((sample.delay_s >= 0).all()) and bool((sample.delay_s < math.inf).all()),
            "a delay is negative or not finite",
        )
        hit = sample.observed_hit_ratio
        check(hit is None or 0.0 <= hit <= 1.0, f"observed hit ratio {hit!r}")
        rate = sample.lambda0
        check(rate is None or (math.isfinite(rate) and rate >= 0), f"lambda0 {rate!r}")

    return test_one_input


# --- seeds, dictionary, driver --------------------------------------------------------------


def seed_corpus(target: str, directory: Path) -> None:
    """Write the seed inputs of ``target`` into ``directory``."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    if target == "parse":
        seeds = [json.dumps(event, ensure_ascii=False).encode() for event in SEED_EVENTS]
        # One of each rejection (valid otherwise), so the fuzzer starts on every error path.
        minimal = SEED_EVENTS[0]
        broken = [
            {"schema": "1"}, {"schema": 2}, {"session_id": 7}, {"session_id": ""}, {"turn": 0},
            {"turn": 1.0}, {"timestamp": -1}, {"timestamp": "5"}, {"input_tokens": None},
            {"cached_tokens": 11}, {"request_id": ["r"]}, {"intent": "x" * 129},
            {"messages": [{"role": "user"}]}, {"block_hashes": [True]}, {"prompt": 5},
        ]  # fmt: skip
        seeds += [json.dumps({**minimal, **change}).encode() for change in broken]
        seeds += [b"[]", b'"event"', b'{"session_id": "s"}', json.dumps(minimal).encode()[:-9]]
    else:
        # Byte strings the FuzzedDataProvider turns into sequences of mostly valid events.
        seeds = [
            bytes((i * 37 + k * 11) % 256 for k in range(n)) for i, n in enumerate((64, 512, 2048))
        ]
        seeds += [bytes(range(256)) * 4, b"\xff" * 1024]
    for index, seed in enumerate(seeds):
        (directory / f"seed-{index:02d}").write_bytes(seed)


def write_dictionary(path: Path) -> None:
    def escape(token: bytes) -> str:
        out = []
        for byte in token:
            char = chr(byte)
            if char in '"\\':
                out.append("\\" + char)
            elif 0x20 <= byte < 0x7F:
                out.append(char)
            else:
                out.append(f"\\x{byte:02X}")
        return "".join(out)

    path.write_text("".join(f'"{escape(token)}"\n' for token in DICTIONARY_TOKENS))


def fuzzer_args(target: str, args: list[str], scratch: Path) -> list[str]:
    """The libFuzzer arguments: the user's, plus a seeded corpus and a dictionary if absent."""
    flags = [arg for arg in args if arg.startswith("-")]
    inputs = [arg for arg in args if not arg.startswith("-")]
    if not any(flag.startswith("-dict=") for flag in flags):
        dictionary = scratch / "kvcast.dict"
        write_dictionary(dictionary)
        flags.append(f"-dict={dictionary}")
    if not any(flag.startswith("-max_len=") for flag in flags):
        flags.append("-max_len=4096")
    if not inputs:
        corpus = scratch / "corpus"
        seed_corpus(target, corpus)
        inputs = [str(corpus)]
    for name in inputs:
        path = Path(name)
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            seed_corpus(target, path)
    return [*flags, *inputs]


STATUS_LINE = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)")
DONE_LINE = re.compile(r"^Done (\d+) runs")


def drive(target: str, args: list[str]) -> int:
    """Run the fuzzer in a child process, pass its output on, end with the FUZZ line."""
    runs = cov = ft = corpus = 0
    failed_input = False
    with tempfile.TemporaryDirectory(prefix="kvcast-fuzz-") as scratch:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            target,
            *fuzzer_args(target, args, Path(scratch)),
        ]
        # A fixed hash seed in the child, so that a -seed= run is comparable; unbuffered, so
        # that atheris's traceback (on stdout) is not lost when libFuzzer ends the process.
        env = {
            **os.environ,
            "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0"),
            "PYTHONUNBUFFERED": "1",
        }
        # The child's stdout and stderr both go to our stderr: our stdout is the FUZZ line.
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        ) as child:
            assert child.stdout is not None
            for raw in child.stdout:
                sys.stderr.buffer.write(raw)
                sys.stderr.buffer.flush()
                line = raw.decode("utf-8", "replace")
                if match := STATUS_LINE.match(line):
                    runs, cov, ft, corpus = map(int, match.groups())
                elif match := DONE_LINE.match(line):
                    runs = int(match.group(1))
                elif "Uncaught Python exception" in line or "ERROR: libFuzzer" in line:
                    failed_input = True
            rc = child.wait()
    status = "ok" if rc == 0 else ("crash" if failed_input else "error")
    print(
        f"FUZZ target={target} status={status} rc={rc} runs={runs} cov={cov} ft={ft} "
        f"corpus={corpus}",
        flush=True,
    )
    return rc


def work(target: str, args: list[str]) -> None:
    """In the child: instrument kvcast, set up the target, hand over to libFuzzer."""
    import atheris

    with atheris.instrument_imports(include=["kvcast"]):
        test_one_input = make_parse_target() if target == "parse" else make_pipeline_target()
    atheris.Setup([sys.argv[0], *args], test_one_input)
    atheris.Fuzz()


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "--worker":
        work(argv[2], argv[3:])
        return 0
    if len(argv) < 2 or argv[1] not in TARGETS:
        print(__doc__, file=sys.stderr)
        print(f"targets: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    return drive(argv[1], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
