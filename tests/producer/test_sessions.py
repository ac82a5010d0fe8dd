"""Session identity (issue 32 item 2): identities never merge, divergent histories branch,
regenerated answers are retries the statistics keep, through the real statistics pipeline."""

from __future__ import annotations

import json

from kvcast.producer import EventBuilder
from kvcast.stats.config import StatsConfig
from kvcast.stats.replay import Pipeline

SECRET = b"a-deployment-secret-of-32-bytes!"
SYSTEM = {"role": "system", "content": "You are the help desk. " * 6}
GREETING = {"role": "user", "content": "hello"}


def reply(text: str, rid: str | None = None) -> dict:
    """A response body as an OpenAI-compatible server sends it (``rid``: its ``id``)."""
    body: dict = {"choices": [{"message": {"role": "assistant", "content": text}}],
                  "usage": {"prompt_tokens": 50, "completion_tokens": 5}}  # fmt: skip
    if rid is not None:
        body["id"] = rid
    return body


def users_conversations(builder: EventBuilder, users: int, *, field: str) -> list[dict]:
    """The issue's scenario: every user sends the same system prompt and greeting and gets the
    same first reply, then asks their own questions; 4 turns each, interleaved, no ids."""
    histories = {u: [SYSTEM, GREETING] for u in range(users)}
    events = []
    for turn in range(4):
        for user, history in histories.items():
            text = "Hi, how can I help?" if turn == 0 else f"answer {turn} for {user}"
            body = {"model": "m", "messages": history}
            context = {}
            if field == "user":
                body["user"] = f"user-{user}"
            elif field in ("identity", "api_key"):
                context[field] = f"secret-{user}"
            arrival_s = 1000.0 + turn * 30 + user * 0.1
            events.append(builder.build(body, reply(text), arrival_s=arrival_s, **context))
            history += [{"role": "assistant", "content": text},
                        {"role": "user", "content": f"question {turn} of user {user}"}]  # fmt: skip
    return events


def through_statistics(events: list[dict]) -> tuple[int, int, float]:
    """(processed, duplicates, mean turns per conversation) as the daemon's statistics see it."""
    pipeline = Pipeline(StatsConfig(), clock_s=max(e["timestamp"] for e in events))
    pipeline.offer_all(json.dumps(e).encode() for e in events)
    counters = pipeline.engine.counters
    open_ = pipeline.engine.tracker.open_items()
    return (
        counters.processed,
        counters.duplicates,
        sum(len(c.turns) for c in open_.values()) / len(open_),
    )


def test_100_users_with_the_same_opening_keep_their_own_sessions_by_user_field() -> None:
    events = users_conversations(EventBuilder(SECRET), 100, field="user")
    assert len({e["session_id"] for e in events}) == 100
    assert through_statistics(events) == (400, 0, 4.0)
    assert "user-1" not in json.dumps(events) and "hello" not in json.dumps(events)


def test_identity_and_api_key_keep_users_apart_and_the_key_never_leaves() -> None:
    for field in ("identity", "api_key"):
        events = users_conversations(EventBuilder(SECRET), 100, field=field)
        assert through_statistics(events) == (400, 0, 4.0), field
        assert "secret-" not in json.dumps(events)


def test_without_identity_a_diverging_history_branches_instead_of_colliding() -> None:
    """Before: every later turn merged into the last user's session (297 duplicates)."""
    builder = EventBuilder(SECRET)
    events = users_conversations(builder, 100, field="none-given")  # no identity at all
    processed, duplicates, _ = through_statistics(events)
    assert (processed, duplicates) == (400, 0)
    pairs = [(e["session_id"], e["turn"]) for e in events]
    assert len(set(pairs)) == 400  # no two requests on one (session, turn)
    assert sum("branch_of" in e for e in events) == builder.branches == 99
    turn3 = [e for e in events if e["turn"] == 3]
    turn2 = {e["session_id"] for e in events if e["turn"] == 2}
    assert all(e["session_id"] in turn2 for e in turn3)  # a branch goes on in its own session


def test_a_regenerated_answer_is_a_retry_that_the_statistics_keep() -> None:
    builder = EventBuilder(SECRET)
    opening = {"messages": [SYSTEM, GREETING], "user": "u1"}
    first = builder.build(opening, reply("Hi!"), arrival_s=1000.0)
    again = builder.build(opening, reply("Hello!"), arrival_s=1005.0)  # "regenerate"
    assert (again["session_id"], again["turn"], again["retry"]) == (first["session_id"], 1, 1)
    assert again["request_id"] != f"{first['session_id']}\x1f1"  # not the default id
    follow = {"messages": [SYSTEM, GREETING, {"role": "assistant", "content": "Hello!"},
                           {"role": "user", "content": "my order"}], "user": "u1"}  # fmt: skip
    second = builder.build(follow, reply("Which one?"), arrival_s=1010.0)
    retried = builder.build(follow, reply("Its number?", rid="chatcmpl-2"), arrival_s=1012.0)
    assert (second["session_id"], second["turn"]) == (first["session_id"], 2)
    assert (retried["turn"], retried["retry"], retried["request_id"]) == (2, 1, "chatcmpl-2")
    assert builder.retries == 2
    assert "retry" not in first and "retry" not in second
    processed, duplicates, mean_turns = through_statistics([first, again, second, retried])
    assert (processed, duplicates, mean_turns) == (4, 0, 2.0)


def test_without_identity_a_first_turn_asked_twice_is_two_sessions() -> None:
    """Two users' identical first requests cannot be told from a regeneration: never merged."""
    builder = EventBuilder(SECRET)
    opening = {"messages": [SYSTEM, GREETING]}
    a, b = builder.build(opening, reply("Hi!")), builder.build(opening, reply("Hi!"))
    assert a["session_id"] != b["session_id"] and "retry" not in b


def test_a_cut_response_says_why() -> None:
    event = EventBuilder(SECRET).build({"messages": [GREETING]}, reply("Hi"), cut="timeout")
    assert event["cut"] == "timeout"
