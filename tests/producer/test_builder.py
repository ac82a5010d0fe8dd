"""From OpenAI-compatible requests and responses to kvcast events, sessions recovered."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvcast.producer import EventBuilder
from kvcast.stats.event_schema import event_json_schema
from kvcast.stats.events import parse_event

SECRET = b"a-deployment-secret-of-32-bytes!"
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}
VALIDATOR = jsonschema.Draft202012Validator(event_json_schema())


def answer(text: str, prompt_tokens: int, cached: int | None = None, rid: str = "c-1") -> dict:
    usage: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": 7}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": rid, "choices": [{"message": {"role": "assistant", "content": text}}],
            "usage": usage}  # fmt: skip


def valid(event: dict) -> dict:
    """The event as kvcast's decoder and the published JSON Schema see it."""
    raw = json.dumps(event)
    parse_event(raw.encode())
    assert VALIDATOR.is_valid(json.loads(raw))
    return event


def test_a_chat_conversation_without_session_ids_keeps_one_session_and_counts_turns() -> None:
    builder = EventBuilder(SECRET)
    history = [SYSTEM, {"role": "user", "content": "my order 123 is late"}]
    events = []
    for turn, reply in enumerate(["Sorry to hear that.", "It ships today.", "You're welcome."]):
        events.append(valid(builder.build({"messages": history}, answer(reply, 100 * (turn + 1)),
                                          arrival_s=1000.0 + turn)))  # fmt: skip
        history = [*history, {"role": "assistant", "content": reply},
                   {"role": "user", "content": f"follow-up {turn}"}]  # fmt: skip
    assert [e["turn"] for e in events] == [1, 2, 3]
    assert len({e["session_id"] for e in events}) == 1
    assert [e["input_tokens"] for e in events] == [100, 200, 300]
    assert "order 123" not in json.dumps(events)  # no user text unless asked for


def test_two_conversations_with_the_same_opening_stay_apart_and_share_prefix_blocks() -> None:
    builder = EventBuilder(SECRET)
    opening = [SYSTEM, {"role": "user", "content": "hello"}]
    first = valid(builder.build({"messages": opening}, answer("Hi! How can I help?", 60)))
    second = valid(builder.build({"messages": opening}, answer("Hello there.", 60)))
    assert first["session_id"] != second["session_id"]
    follow = [*opening, {"role": "assistant", "content": "Hello there."},
              {"role": "user", "content": "book a flight"}]  # fmt: skip
    third = valid(builder.build({"messages": follow}, answer("Where to?", 90)))
    assert (third["session_id"], third["turn"]) == (second["session_id"], 2)
    shared = len(first["block_hashes"])  # the system prompt and "hello": the same blocks
    assert shared >= 2 and third["block_hashes"][:shared] == first["block_hashes"]


def test_the_callers_session_and_turn_win() -> None:
    builder = EventBuilder(SECRET)
    event = builder.build({"messages": [{"role": "user", "content": "x"}]}, answer("y", 5),
                          session_id="router-42", turn=7, intent="chitchat")  # fmt: skip
    assert (event["session_id"], event["turn"], event["intent"]) == ("router-42", 7, "chitchat")


def test_block_hashes_are_keyed_chained_and_over_token_blocks_when_ids_are_given() -> None:
    ids = list(range(40))
    a = EventBuilder(SECRET, block_size=16).build({"prompt": "p"}, answer("r", 40), token_ids=ids)
    b = EventBuilder(SECRET, block_size=16).build(
        {"prompt": "p"}, answer("r", 40), token_ids=[*ids[:16], 99, *ids[17:]]
    )
    other = EventBuilder(b"another-secret-of-enough-length!", block_size=16).build(
        {"prompt": "p"}, answer("r", 40), token_ids=ids
    )
    assert len(a["block_hashes"]) == 2  # 40 tokens: two full blocks of 16; the tail is not one
    assert a["block_hashes"][0] == b["block_hashes"][0] != b["block_hashes"][1]
    assert a["block_hashes"][1] != b["block_hashes"][1]  # a changed block changes what follows
    assert not set(a["block_hashes"]) & set(other["block_hashes"])  # the secret keys them
    assert all(0 <= h < 2**63 for h in a["block_hashes"])


def test_cached_tokens_come_from_usage_and_never_exceed_the_input() -> None:
    builder = EventBuilder(SECRET)
    assert valid(builder.build({"prompt": "x"}, answer("y", 50, cached=32)))["cached_tokens"] == 32
    assert "cached_tokens" not in builder.build({"prompt": "x"}, answer("y", 50, cached=80))
    assert "cached_tokens" not in builder.build({"prompt": "x"}, answer("y", 50))


def test_text_goes_along_only_when_the_operator_turns_it_on() -> None:
    builder = EventBuilder(SECRET, include_text=True)
    messages = [{"role": "user", "content": [{"type": "text", "text": "fix my code"}]}]
    event = valid(builder.build({"messages": messages}, answer("ok", 9)))
    assert event["messages"] == [{"role": "user", "content": "fix my code"}]


def test_the_conversation_memory_is_bounded() -> None:
    builder = EventBuilder(SECRET, max_conversations=2)
    openings = [[{"role": "user", "content": f"question {n}"}] for n in range(3)]
    firsts = [builder.build({"messages": o}, answer(f"reply {n}", 10)) for n, o in
              enumerate(openings)]  # fmt: skip
    again = [[*o, {"role": "assistant", "content": f"reply {n}"},
              {"role": "user", "content": "more"}] for n, o in enumerate(openings)]  # fmt: skip
    oldest = builder.build({"messages": again[0]}, answer("z", 20))
    newest = builder.build({"messages": again[2]}, answer("z", 20))
    assert oldest["turn"] == 1 and oldest["session_id"] != firsts[0]["session_id"]  # forgotten
    assert (newest["turn"], newest["session_id"]) == (2, firsts[2]["session_id"])


@pytest.mark.parametrize(
    ("secret", "block_size", "message"),
    [(b"short", 16, "at least 16 bytes"), (SECRET, 0, "block_size must be >= 1")],
)
def test_bad_settings_are_refused_with_the_reason(secret, block_size, message) -> None:
    with pytest.raises(ValueError, match=message):
        EventBuilder(secret, block_size=block_size)
