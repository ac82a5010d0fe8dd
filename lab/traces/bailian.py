"""Qwen-Bailian usage traces: ``chat_id``, ``parent_chat_id`` (-1 for a root), ``timestamp``
(s), ``input_length``, ``output_length``, ``type``, ``turn``, ``hash_ids`` (16-token blocks).

A conversation is a tree of chats rooted at a chat whose ``parent_chat_id`` is -1; every chat
joins the session of its root (``{prefix}-{root chat_id}``). A chat whose parent is not in the
trace (the trace window cut it off) joins the session named after that parent, so its siblings
stay together. ``turn`` comes from the record (else the parent's turn + 1, else 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvcast.lab.traces.common import ConversionSummary, TraceError, hash_list, need

BLOCK_SIZE = 16  # tokens per Bailian hash block


def convert_bailian(
    records: Iterable[tuple[int, Any]], *, session_prefix: str = "bl"
) -> tuple[list[dict[str, Any]], ConversionSummary]:
    """Events (timestamp order) from ``(line, record)`` pairs; raises :class:`TraceError`."""
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for line, obj in records:
        ts = need(obj, "timestamp", line, "number")
        need(obj, "chat_id", line, "id")
        need(obj, "parent_chat_id", line, "id")
        need(obj, "input_length", line, "int")
        need(obj, "output_length", line, "int")
        hash_list(obj, "hash_ids", line)
        turn = obj.get("turn")
        if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 1):
            raise TraceError(line, f"field 'turn' must be an int >= 1, got {turn!r:.40}")
        kind = obj.get("type")
        if kind is not None and not isinstance(kind, str):
            raise TraceError(line, f"field 'type' must be a string, got {kind!r:.40}")
        rows.append((float(ts), line, obj))
    rows.sort(key=lambda r: (r[0], r[1]))
    root_of: dict[Any, Any] = {}
    turn_of: dict[Any, int] = {}
    events: list[dict[str, Any]] = []
    summary = ConversionSummary("bailian", records=len(rows))
    orphans = 0
    seen_ids: set[Any] = set()
    for ts, line, obj in rows:
        chat, parent = obj["chat_id"], obj["parent_chat_id"]
        if chat in seen_ids:
            raise TraceError(line, f"chat_id {chat!r:.40} appears twice")
        seen_ids.add(chat)
        if parent in (-1, "-1"):
            root, parent_turn = chat, 0
        elif parent in root_of:
            root, parent_turn = root_of[parent], turn_of[parent]
        else:
            orphans += 1
            root, parent_turn = parent, 0
        turn = obj.get("turn") or parent_turn + 1
        root_of[chat], turn_of[chat] = root, turn
        summary.turns[turn] += 1
        ev: dict[str, Any] = {
            "session_id": f"{session_prefix}-{root}",
            "turn": turn,
            "timestamp": ts,
            "input_tokens": obj["input_length"],
            "output_tokens": obj["output_length"],
            "request_id": f"{session_prefix}-{chat}",
            "block_hashes": obj["hash_ids"],
        }
        if obj.get("type") is not None:
            ev["type"] = obj["type"]
        events.append(ev)
    summary.events = len(events)
    summary.conversations = len({ev["session_id"] for ev in events})
    summary.extra["orphans"] = orphans
    return events, summary
