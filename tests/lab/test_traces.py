"""The trace converters on hand-made traces with known structure, and on the shared trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcast.lab.traces import (
    TraceError,
    convert_bailian,
    convert_mooncake,
    convert_sharegpt,
    recover_conversations,
)
from kvcast.stats.events import parse_event

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "data" / "traces" / "mooncake_synthetic_trace.jsonl"


def _mc(ts: int, ids: list[int], inp: int | None = None) -> dict[str, Any]:
    return {
        "timestamp": ts,
        "input_length": inp or 512 * len(ids),
        "output_length": 3,
        "hash_ids": ids,
    }


def test_mooncake_prefix_chains_most_recent_and_forks() -> None:
    rows = [
        _mc(0, [1, 2]),  # A turn 1
        _mc(1000, [7, 8]),  # B turn 1
        _mc(2000, [1, 2, 3]),  # A turn 2 (A1 is a prefix)
        _mc(3000, [1, 2, 3, 4, 5]),  # A turn 3: A2 is the most recent prefix
        _mc(4000, [1, 2, 9]),  # fork: A1 is its most recent prefix, already continued
        _mc(5000, [7, 8]),  # B turn 2: equal ids form a prefix
    ]
    events, summary = convert_mooncake(enumerate(rows, 1))
    sessions = [e["session_id"] for e in events]
    assert [e["turn"] for e in events] == [1, 1, 2, 3, 1, 2]
    assert sessions[0] == sessions[2] == sessions[3] != sessions[4]
    assert sessions[1] == sessions[5]
    assert events[3]["timestamp"] == 3.0 and events[3]["block_hashes"] == [1, 2, 3, 4, 5]
    assert summary.conversations == 3 and summary.extra["forks"] == 1
    for ev in events:
        parse_event(ev)  # every event meets the contract


def test_mooncake_common_system_prompt_is_not_a_parent() -> None:
    hashes = [[0, 1], [0, 5], [0, 1, 2], [0]]
    parent, turn, info = recover_conversations(hashes)
    assert info["common_prefix"] == 1
    # [0] alone shares only the system prompt: a start; [0, 1, 2] continues [0, 1].
    assert parent == [-1, -1, 0, -1] and turn == [1, 1, 2, 1]


def test_mooncake_hashable_match_ignores_a_partial_tail() -> None:
    hashes = [[1, 2], [9], [1, 3, 4]]  # turn 1's last block (2) was partial, then rehashed
    lengths = [600, 100, 1500]
    assert recover_conversations(hashes, lengths, match="full")[0] == [-1, -1, -1]
    assert recover_conversations(hashes, lengths, match="hashable")[0] == [-1, -1, 0]
    # A full last block must match.
    assert recover_conversations(hashes, [1024, 100, 1500], match="hashable")[0] == [-1] * 3


def test_mooncake_bad_lines_name_the_line() -> None:
    with pytest.raises(TraceError, match="line 2: missing field 'hash_ids'"):
        convert_mooncake(
            [(1, _mc(0, [1])), (2, {"timestamp": 1, "input_length": 1, "output_length": 1})]
        )
    with pytest.raises(TraceError, match="line 5: hash_ids has 1 ids"):
        convert_mooncake([(5, _mc(0, [1], inp=2000))])
    with pytest.raises(TraceError, match="line 3: field 'timestamp'"):
        convert_mooncake([(3, {**_mc(0, [1]), "timestamp": "x"})])


def test_mooncake_shared_trace_recovery_counts() -> None:
    import orjson

    if not MOONCAKE.exists():  # shipped in the repository (data/traces)
        pytest.fail(f"{MOONCAKE} is missing: it ships with the repository (data/traces)")
    with open(MOONCAKE, "rb") as fh:
        records = [(k, orjson.loads(line)) for k, line in enumerate(fh, 1)]
    _, full = convert_mooncake(records, match="full")
    _, hashable = convert_mooncake(records, match="hashable")
    _, default = convert_mooncake(records)
    assert default.to_dict() == hashable.to_dict()  # the better rule is the default
    assert (full.records, full.conversations, full.max_turn) == (3993, 3780, 9)
    assert (hashable.conversations, hashable.max_turn, hashable.extra["forks"]) == (2649, 24, 111)


def test_bailian_trees_and_orphans() -> None:
    rows = [
        {
            "chat_id": 10,
            "parent_chat_id": -1,
            "timestamp": 1.0,
            "input_length": 40,
            "output_length": 5,
            "type": "text",
            "turn": 1,
            "hash_ids": [1, 2, 3],
        },
        {
            "chat_id": 11,
            "parent_chat_id": 10,
            "timestamp": 9.0,
            "input_length": 70,
            "output_length": 5,
            "type": "text",
            "turn": 2,
            "hash_ids": [1, 2, 3, 4, 5],
        },
        {
            "chat_id": 12,
            "parent_chat_id": 99,
            "timestamp": 5.0,
            "input_length": 16,
            "output_length": 1,
            "type": "search",
            "hash_ids": [8],
        },
    ]
    events, summary = convert_bailian(enumerate(rows, 1))
    assert [e["request_id"] for e in events] == ["bl-10", "bl-12", "bl-11"]
    assert [e["session_id"] for e in events] == ["bl-10", "bl-99", "bl-10"]
    assert [e["turn"] for e in events] == [1, 1, 2]
    assert events[1]["type"] == "search" and events[2]["block_hashes"] == [1, 2, 3, 4, 5]
    assert summary.conversations == 2 and summary.extra["orphans"] == 1
    with pytest.raises(TraceError, match="line 1: field 'turn'"):
        convert_bailian([(1, {**rows[0], "turn": 0})])


def test_sharegpt_turns_tokens_and_timing() -> None:
    conv = {
        "id": "x",
        "conversations": [
            {"from": "system", "value": "s" * 8},  # 2 tokens of context
            {"from": "human", "value": "h" * 10},  # 3 tokens
            {"from": "gpt", "value": "g" * 40},  # 10 tokens
            {"from": "human", "value": "k" * 4},  # 1 token
        ],
    }
    empty = {"id": "y", "conversations": [{"from": "gpt", "value": "hi"}]}
    events, summary = convert_sharegpt([(1, conv), (2, empty), (3, conv)], rate=2.0, seed=3)
    first = [e for e in events if e["session_id"] == "sg-x"]
    assert [(e["turn"], e["input_tokens"], e["output_tokens"]) for e in first] == [
        (1, 5, 10),
        (2, 16, 0),
    ]
    assert first[0]["prompt"] == "h" * 10
    assert first[0]["timestamp"] == 0.0 < first[1]["timestamp"]
    assert summary.skipped == 1 and summary.conversations == 2 and summary.events == 4
    assert len({e["session_id"] for e in events}) == 2  # a repeated id gets its own session
    again, _ = convert_sharegpt([(1, conv), (2, empty), (3, conv)], rate=2.0, seed=3)
    assert again == events
    with pytest.raises(TraceError, match=r"line 4: conversations\[0\]\.from"):
        convert_sharegpt([(4, {"conversations": [{"from": "alien", "value": ""}]})])
